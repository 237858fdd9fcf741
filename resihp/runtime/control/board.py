"""The controller's c10d store as the protocol sees it: typed values under the protocol's keys.

The controller writes each key once; every member reads it: a `Generation` under `plan/{g}`, a
`Gate` under `go/{g}`, a `Decision` under `decision/{g}/{k}` (`protocol.py`). The same store hosts
the members' gloo rendezvous (`PrefixStore(f"gen{g}", store)`) and outlives any member.
"""

from __future__ import annotations

import pickle
from datetime import timedelta

import torch.distributed as dist

from .protocol import PG_TIMEOUT_S, Decision, Gate, Generation, decision_key, go_key, plan_key, read_decision


class Board:
    """The protocol's values in the controller's store (a `TCPStore`, or any object with `set`,
    `get` and `wait`). The controller writes, members read; a key is written once."""

    def __init__(self, store, timeout_s: float = PG_TIMEOUT_S) -> None:
        self.store, self.timeout = store, timedelta(seconds=timeout_s)

    # controller
    def publish(self, body: Generation | None, generation: int) -> None:
        """`plan/{generation}`: its body, or None (no further generation: standby members stop)."""
        self.store.set(plan_key(generation), pickle.dumps(body))

    def gate(self, generation: int, gate: Gate) -> None:
        self.store.set(go_key(generation), gate.value)

    def decide(self, generation: int, it: int, decision: Decision) -> None:
        self.store.set(decision_key(generation, it), decision.encode())

    # members
    def generation(self, generation: int) -> Generation | None:
        """The body of `plan/{generation}` once published, however long that takes (a standby member
        may wait a whole run for it; its agent's watchdog ends an orphan)."""
        return pickle.loads(self._wait(plan_key(generation)))

    def wait_gate(self, generation: int) -> Gate:
        return Gate(self._wait(go_key(generation)).decode())

    def decision(self, generation: int, it: int) -> Decision:
        """The decision on iteration `it` (blocks up to the store timeout, then raises). A member
        takes it through its agent instead (`relay.py`: one store read per node)."""
        return read_decision(self.store.get(decision_key(generation, it)))

    def _wait(self, key: str) -> bytes:
        while True:
            try:
                self.store.wait([key], self.timeout)
                return self.store.get(key)
            except dist.DistStoreError:
                continue
