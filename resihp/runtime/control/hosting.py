"""Where a job's store listens and where its node agents come from (`Hosting`), and the run keys
that say so (`run.nodes`, `run.controller_timeout_s`, `run.controller_wait_s`: `check_hosting`).

Two ways to run, one code path (the store is the only wire either way, `transport.py`):

* embedded (`resihp train`, `nodes` None): the controller listens on 127.0.0.1 and forks one agent
  per node on its own host when the node gets its first member (`agent.Agents`);
* multi-host (`resihp controller`, `nodes` = n): the controller listens at `listen` and admits
  the n agents that `resihp agent --controller HOST:PORT --node-rank K` started on their machines
  (`remote.RemoteAgents`), waiting up to `wait_s` for them.

The controller publishes what an agent needs to know under `RUN_KEY` (`run_info`): its
`controller_timeout_s` (after which an agent that cannot reach the store fences itself), its
`controller_wait_s` (how long such an agent then waits for a new controller at the same address,
unless its `--wait-s` says otherwise: `serve.py`), the devices per node (an agent started with
another `--devices` refuses to serve), `run.device` (on "cuda" an agent whose machine has fewer
GPUs than the node's devices refuses to serve: `serve.check_node`), and an `incarnation`: a token
drawn afresh by each controller's store, by which an agent that lost its controller tells a
restarted one (which it registers with afresh) from the one it fenced itself from (which it never
serves again).

Torch-free at import (the store is made on `store()`).
"""

from __future__ import annotations

import pickle
import secrets
from dataclasses import dataclass

from .agent import CONTROLLER_TIMEOUT_S

CONTROLLER_WAIT_S = (
    60.0  # default `run.controller_wait_s`: how long agents and controller wait for each other
)
RUN_KEY = "resihp/run"
CONTROLLER_TIMEOUT_RANGE_S = (0.5, 600.0)
CONTROLLER_WAIT_RANGE_S = (0.0, 86400.0)


@dataclass(frozen=True)
class Hosting:
    """`listen`: (host, port) of the controller's store, `host` as every agent and member reaches it
    (port 0: a free one); `nodes`: None for the embedded agents, else how many agents register
    (node ranks 0..nodes-1); `wait_s`: how long the controller waits for them (and, published, how
    long an agent that lost its controller waits for a new one);
    `controller_timeout_s`: the agents' fencing timeout; `device`: `run.device`."""

    listen: tuple[str, int] = ("127.0.0.1", 0)
    nodes: int | None = None
    wait_s: float = CONTROLLER_WAIT_S
    controller_timeout_s: float = CONTROLLER_TIMEOUT_S
    devices_per_node: int | None = None
    device: str = "cpu"

    def store(self):
        """The controller's `TCPStore` (the master: it lives as long as this object is referenced),
        with the run's facts for the agents under `RUN_KEY` (a fresh `incarnation` each call)."""
        import torch.distributed as dist

        host, port = self.listen
        store = dist.TCPStore(host, port, is_master=True, wait_for_workers=False)
        info = {"controller_timeout_s": self.controller_timeout_s, "controller_wait_s": self.wait_s,
                "devices_per_node": self.devices_per_node, "device": self.device,
                "incarnation": secrets.token_hex(8)}  # fmt: skip
        store.set(RUN_KEY, pickle.dumps(info))
        return store


def run_info(data: bytes) -> dict:
    """What the controller published under `RUN_KEY`."""
    info = pickle.loads(data)
    assert isinstance(info, dict) and {"controller_timeout_s", "incarnation"} <= set(info), info
    return info


def check_hosting(nodes, controller_timeout_s, controller_wait_s, devices_per_node, workers: int) -> None:
    """The run keys of the multi-host controller (one line naming the key, the value, what is allowed)."""
    if nodes is not None:
        if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
            raise ValueError(
                f"run.nodes = {nodes!r}: must be a positive integer (agents of node ranks 0..n-1)"
            )
        if devices_per_node is None:
            raise ValueError(f"run.nodes = {nodes}: needs run.devices_per_node (the devices of each node)")
        if nodes * devices_per_node < workers:
            raise ValueError(
                f"run.nodes = {nodes}: {nodes} x run.devices_per_node = {devices_per_node} devices, "
                f"fewer than run.workers = {workers}"
            )
    for key, v, (lo, hi) in (
        ("controller_timeout_s", controller_timeout_s, CONTROLLER_TIMEOUT_RANGE_S),
        ("controller_wait_s", controller_wait_s, CONTROLLER_WAIT_RANGE_S),
    ):
        if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
            raise ValueError(f"run.{key} = {v!r}: must be a number of seconds in [{lo:g}, {hi:g}]")
