"""Liveness of the elastic runtime's members: heartbeats and the join barrier.

Torch-free; the controller (`controller.py`, `processes.py`) judges, members and agents beat.

* Heartbeats: every member process sends a `Heartbeat` on its node's heartbeat channel every
  `HEARTBEAT_S` from a daemon thread (`HeartbeatThread`) — unless it sent the controller a report
  within the last half period: every member message is a beat on its arrival (`Inbox`), so a
  member that reports every iteration sends no heartbeats. Gloo and store waits release the GIL, so
  a member blocked in a collective still beats; only a dead or frozen process (SIGSTOP, a hung
  device) goes silent. The agent (`agent.py`) forwards its members' last beats with its own beat,
  an `AgentBeat`, every `HEARTBEAT_S`. The controller reads its channel through an `Inbox`, which
  takes every message that has arrived in one read and applies the agents' reports at once
  (`agent_beat` feeds a `Liveness` for the members and one for the agents): silence is judged on
  data at most `Inbox.FRESH_S` old even right after the controller itself was busy (a replan, a
  checkpoint), and on the `ListeningClock`, which leaves out the controller's own pauses. A
  member silent for `timeout_s` after its first beat is *hung* (its agent SIGKILLs it on the
  controller's command, and its death is a fail-stop); one with no first beat `start_timeout_s`
  after its spawn never started (the job fails). A silent agent is a dead node.
* `JoinBarrier`: a member reports `Joining` generation g and waits on the store key `go/{g}`
  before any gloo call of g. The controller writes `Gate.GO` once every member of g has arrived
  (and lives), or `Gate.ABORT` when g is superseded first (a member died): a death before `go`
  never reaches gloo, and after `go` every member is already at the rendezvous, so its timeout can
  be short (`member.JOIN_TIMEOUT_S`).
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable

from .protocol import FROM_AGENT, AgentBeat, Gate, Heartbeat

HEARTBEAT_S = 0.25  # a member's heartbeat period
HEARTBEAT_TIMEOUT_S = 3.0  # default `run.heartbeat_timeout_s`: silence after which a member is hung
# allowed `run.heartbeat_timeout_s`: from 4 periods (shorter kills healthy members of a busy machine)
# to well under the gloo timeout (`protocol.PG_TIMEOUT_S`, 120 s), which heartbeats must beat
HEARTBEAT_TIMEOUT_RANGE_S = (1.0, 60.0)
START_TIMEOUT_S = 60.0  # a spawned member's first heartbeat must come within this (workers import torch)
LISTEN_GAP_S = 2 * HEARTBEAT_S  # a pause of the controller's own longer than this counts as this long


class ListeningClock:
    """The controller's liveness clock: `clock()` (monotonic seconds) less the time it was not
    listening. A gap between two readings longer than `gap_s` — the controller itself paused: a full
    garbage collection over torch's objects, its CPU taken on a loaded machine, a long handler —
    advances it by `gap_s` only. A loaded machine pauses the agents together with the controller
    (at start-up, 8 members building groups on 2 cores): their beats resume when it does, and a
    silence that nobody was there to hear is not judged; a silence that goes on while the
    controller listens is, after `timeout_s` of listening. Readings: every turn of the controller
    (`Processes.check_alive`) and every report it applies."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, gap_s: float = LISTEN_GAP_S) -> None:
        self.clock, self.gap_s = clock, gap_s
        self.last: float | None = None  # the previous raw reading
        self.skipped = 0.0  # seconds of gaps beyond `gap_s`, summed

    def __call__(self) -> float:
        raw = self.clock()
        if self.last is not None and raw - self.last > self.gap_s:
            self.skipped += raw - self.last - self.gap_s
        self.last = raw
        return raw - self.skipped


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
        """`device` was heard from at `now` (a forwarded beat may be older than a report heard
        before it: the newer stays)."""
        if device in self.spawned:  # a forgotten (dead, done) member's last beats are ignored
            self.last[device] = max(now, self.last.get(device, now))

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


def agent_beat(msg: AgentBeat, members: Liveness, nodes: Liveness, now: float) -> None:
    """Apply an agent's beat received at `now`: its node beats now, each device as of `now - age`,
    its beat's age on the agent's clock (`msg.time - t`): no clock offset between machines enters."""
    nodes.beat(msg.node, now)
    for dev, t in msg.beats.items():
        members.beat(dev, now - (msg.time - t))


class HeartbeatThread:
    """A daemon thread that sends `Heartbeat(device, time, pid)` on the agent's channel `beats`
    every `period_s` until `stop` — unless the member sent a report on `reports` (its channel to
    the controller) within the last half period: the controller counts each member message as a
    beat on arrival (`Inbox`), so a member reporting every iteration costs the store no beats, and
    the longest silence stays 1.5 periods."""

    def __init__(self, device: int, beats, period_s: float = HEARTBEAT_S, reports=None) -> None:
        self.beats, self.quiet = beats, threading.Event()

        def beat() -> None:
            while not self.quiet.is_set():
                recent = reports is not None and time.monotonic() - reports.sent_at < period_s / 2
                try:
                    if not recent:
                        beats.send(Heartbeat(device, time.time(), os.getpid()))
                except (ValueError, OSError):  # closed
                    return
                self.quiet.wait(period_s)

        self.thread = threading.Thread(target=beat, name="heartbeat", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Silence the thread (its last beat, if one is on its way, is sent whole: a store push)."""
        self.quiet.set()
        self.thread.join(1.0)


class Inbox:
    """The controller's channel, the agents' reports applied on arrival.

    `get` hands out the oldest member message not handed out yet (or None), which the controller
    dispatches in turn. When none is left, or the last read is older than `FRESH_S`, it first
    takes every message that has arrived (`drain`, one read of the channel): the agents' reports
    (`protocol.FROM_AGENT`: beats, spawns, exits) go to `dispatch` at once, and each member
    message is `heard` (`Processes`: a beat of its device, on arrival), so that the heartbeat
    times and the process table are current whenever the controller checks — within `FRESH_S`,
    far below any heartbeat timeout, without a store read per message handed out.
    """

    FRESH_S = 0.05

    def __init__(self, channel, dispatch: Callable[[object], None], heard=None) -> None:
        self.channel, self.dispatch, self.heard = channel, dispatch, heard
        self.pending: deque = deque()
        self.read_at = float("-inf")  # (time.monotonic)

    def drain(self, timeout_s: float = 0.0) -> None:
        """Take every message that has arrived, waiting up to `timeout_s` for the first one."""
        for msg in self.channel.recv_all(timeout_s):
            if msg.kind in FROM_AGENT:
                self.dispatch(msg)
            else:
                if self.heard is not None:
                    self.heard(msg)
                self.pending.append(msg)
        self.read_at = time.monotonic()

    def get(self, timeout_s: float):
        if not self.pending or time.monotonic() - self.read_at > self.FRESH_S:
            self.drain(0.0 if self.pending else timeout_s)
        return self.pending.popleft() if self.pending else None


class JoinBarrier:
    """Per generation: the members expected to join, those that reported `joining`, the verdict;
    `seen`: the devices that reported `joining` any generation (the controller forgets a device
    when it spawns a fresh process for it)."""

    def __init__(self) -> None:
        self.expected: dict[int, set[int]] = {}
        self.arrived: dict[int, set[int]] = {}
        self.verdict: dict[int, Gate] = {}
        self.seen: set[int] = set()

    def open(self, generation: int, members) -> None:
        self.expected[generation] = set(members)
        self.arrived.setdefault(generation, set())

    def arrive(self, generation: int, device: int) -> None:
        self.arrived.setdefault(generation, set()).add(device)
        self.seen.add(device)

    def ready(self, generation: int) -> bool:
        """Every expected member arrived and no verdict was given yet: time to write `go`."""
        return generation not in self.verdict and self.arrived[generation] >= self.expected[generation]

    def decide(self, generation: int, verdict: Gate) -> None:
        self.verdict[generation] = verdict

    def supersede(self, generation: int) -> list[int]:
        """Generations before `generation` still without a verdict, now marked `Gate.ABORT`."""
        out = sorted(g for g in self.expected if g < generation and g not in self.verdict)
        for g in out:
            self.verdict[g] = Gate.ABORT
        return out
