"""Liveness of the elastic runtime's members: heartbeats and the join barrier.

Torch-free; the controller (`controller.py`, `processes.py`) uses both, member
processes send the messages.

* Heartbeats: every member process puts ("heartbeat", device, {"time", "pid"}) on its node agent's
  queue every `HEARTBEAT_S` from a daemon thread (`member.Heartbeat`). Gloo and store waits release
  the GIL, so a member blocked in a collective still beats; only a dead or frozen process (SIGSTOP, a
  hung device) goes silent. The agent (`agent.py`) forwards its members' last beats with its own
  beat, ("agent", node, {"time", "beats"}), every `HEARTBEAT_S`. The controller reads its queue
  through an `Inbox`, which takes every message that has arrived before handing one out and feeds
  heartbeats to a `Liveness` (one for the members, one for the agents): silence is judged on current
  data even right after the controller itself was busy (a replan, a checkpoint). A member silent for
  `timeout_s` after its first beat is *hung* (its agent SIGKILLs it on the controller's command, and
  its death is a fail-stop); one with no first beat `start_timeout_s` after its spawn never started
  (the job fails). A silent agent is a dead node.
* `JoinBarrier`: a member reports `joining` generation g and waits on the store key `go/{g}`
  before any gloo call of g. The controller writes `go` once every member of g has arrived (and
  lives), or `abort` when g is superseded first (a member died): a death before `go` never
  reaches gloo, and after `go` every member is already at the rendezvous, so its timeout can be
  short (`member.JOIN_TIMEOUT_S`).
"""

from __future__ import annotations

import queue as queue_mod
import time
from collections import deque
from collections.abc import Callable

HEARTBEAT_S = 0.25  # a member's heartbeat period
HEARTBEAT_TIMEOUT_S = 3.0  # default `run.heartbeat_timeout_s`: silence after which a member is hung
# allowed `run.heartbeat_timeout_s`: from 4 periods (shorter kills healthy members of a busy machine)
# to well under the gloo timeout (`member.PG_TIMEOUT_S`, 120 s), which heartbeats must beat
HEARTBEAT_TIMEOUT_RANGE_S = (1.0, 60.0)
START_TIMEOUT_S = 60.0  # a spawned member's first heartbeat must come within this (workers import torch)


def go_key(generation: int) -> str:
    return f"go/{generation}"


class Liveness:
    """Last heartbeat per member (controller clock); who is hung, who never started."""

    def __init__(self, timeout_s: float = HEARTBEAT_TIMEOUT_S, start_timeout_s: float = START_TIMEOUT_S):
        self.timeout_s, self.start_timeout_s = timeout_s, start_timeout_s
        self.spawned: dict[int, float] = {}  # device -> when its (current) process was started
        self.last: dict[int, float] = {}  # device -> when its last heartbeat arrived

    def spawn(self, device: int, now: float) -> None:
        self.spawned[device] = now
        self.last.pop(device, None)

    def beat(self, device: int, now: float) -> None:
        if device in self.spawned:  # a forgotten (dead, done) member's last beats are ignored
            self.last[device] = now

    def forget(self, device: int) -> None:
        self.spawned.pop(device, None)
        self.last.pop(device, None)

    def hung(self, now: float) -> list[int]:
        """Members that have beaten and then stayed silent for more than `timeout_s`."""
        return sorted(d for d, t in self.last.items() if now - t > self.timeout_s)

    def unstarted(self, now: float) -> list[int]:
        """Members with no heartbeat yet, `start_timeout_s` after their spawn."""
        return sorted(
            d for d, t in self.spawned.items() if d not in self.last and now - t > self.start_timeout_s
        )


class Inbox:
    """The controller's queue (members' and agents' messages), liveness reports taken out.

    `get` first takes every message that has arrived (`drain`), so that the heartbeat times and the
    process table are current whenever the controller checks, then hands out the oldest other
    message (or None). A member's ("heartbeat", device, _) and an agent's ("agent", node, {"time",
    "beats": {device: t}}) go to `liveness` — a forwarded beat dated by its age on the agent's clock,
    `time - t` — and the agent's own beat to `nodes`; ("spawned" | "exited", ...) go to `track`.
    """

    def __init__(
        self,
        queue,
        liveness: Liveness,
        clock: Callable[[], float] = time.monotonic,
        nodes: Liveness | None = None,
        track: Callable[[tuple], None] | None = None,
    ):
        self.queue, self.liveness, self.clock = queue, liveness, clock
        self.nodes, self.track = nodes, track
        self.pending: deque = deque()

    def drain(self, timeout_s: float = 0.0) -> None:
        """Take every message that has arrived, waiting up to `timeout_s` for the first one."""
        block = timeout_s > 0
        while True:
            try:
                msg = self.queue.get(timeout=timeout_s) if block else self.queue.get_nowait()
            except queue_mod.Empty:
                break
            block = False
            if msg[0] == "heartbeat":
                self.liveness.beat(msg[1], self.clock())
            elif msg[0] == "agent":
                now = self.clock()
                self.nodes.beat(msg[1], now)
                for dev, t in msg[2]["beats"].items():
                    self.liveness.beat(dev, now - (msg[2]["time"] - t))
            elif msg[0] in ("spawned", "exited"):
                self.track(msg)
            else:
                self.pending.append(msg)

    def get(self, timeout_s: float) -> tuple | None:
        self.drain(0.0 if self.pending else timeout_s)
        return self.pending.popleft() if self.pending else None


class JoinBarrier:
    """Per generation: the members expected to join, those that reported `joining`, the verdict."""

    def __init__(self) -> None:
        self.expected: dict[int, set[int]] = {}
        self.arrived: dict[int, set[int]] = {}
        self.verdict: dict[int, str] = {}

    def open(self, generation: int, members) -> None:
        self.expected[generation] = set(members)
        self.arrived.setdefault(generation, set())

    def arrive(self, generation: int, device: int) -> None:
        self.arrived.setdefault(generation, set()).add(device)

    def ready(self, generation: int) -> bool:
        """Every expected member arrived and no verdict was given yet: time to write `go`."""
        return generation not in self.verdict and self.arrived[generation] >= self.expected[generation]

    def decide(self, generation: int, verdict: str) -> None:
        self.verdict[generation] = verdict

    def supersede(self, generation: int) -> list[int]:
        """Generations before `generation` still without a verdict, now marked `abort`."""
        out = sorted(g for g in self.expected if g < generation and g not in self.verdict)
        for g in out:
            self.verdict[g] = "abort"
        return out
