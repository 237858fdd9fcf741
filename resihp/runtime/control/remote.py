"""The controller's side of node agents it did not start (`resihp agent` on other machines).

`RemoteAgents` has `agent.Agents`' interface (the process table, commands, dead nodes, shutdown)
but no process of its own to start, kill or reap, and no pid of another host to look at:

* `admit`: before the job starts, each of the `nodes` agents must have beaten (an `AgentBeat` in
  the inbox, arrival on the controller's clock) within `wait_s`; else the job fails naming the
  nodes that never came;
* fencing (`lost`): a node silent for the heartbeat timeout is dead. The controller bumps its
  fence counter in the store (`transport.Transport.fence`) and empties its channels: an agent that
  sees its counter move past the value it started with kills its members and exits (`agent.py`),
  so a node cut off and then back never serves the generation it was fenced from; one that cannot
  reach the store fences itself after `controller_timeout_s` (and then waits for a controller of
  another incarnation, never this one: `serve.py`). Its devices are fail-stops at once;
* `spawn` on a node declared dead waits for a fresh agent of that node (the start timeout
  applies: a re-join needs the node's agent restarted);
* `shutdown`: every agent is told, and the controller waits until each has taken the command
  from its queue (then it reaps its members and exits by itself), at most grace + `AGENT_EXIT_S`.

Torch-free.
"""

from __future__ import annotations

import signal
import time

from ..job import WorkerFailed
from .agent import AGENT_EXIT_S, Agents
from .protocol import Kill, Shutdown, Spawn


class RemoteAgents(Agents):
    """`nodes` agents that register themselves (node ranks 0..nodes-1)."""

    def __init__(
        self, transport, devices_per_node: int, timeout_s: float, start_timeout_s: float, nodes: int,
        clock=time.monotonic,
    ):  # fmt: skip
        super().__init__(transport, devices_per_node, timeout_s, start_timeout_s, clock=clock)
        self.nodes = nodes
        self.live: set[int] = set()  # nodes whose agent is admitted and not declared dead
        self.admitted = False

    def admit(self, drain, wait_s: float) -> None:
        """Wait up to `wait_s` until every node's agent has beaten; `drain(timeout_s)` reads the
        inbox (its `AgentBeat`s reach `self.liveness`)."""
        now = self.clock()
        for node in range(self.nodes):
            self.liveness.spawn(node, now)
        deadline = time.monotonic() + wait_s
        while True:
            missing = [n for n in range(self.nodes) if n not in self.liveness.last]
            if not missing or time.monotonic() >= deadline:
                break
            drain(0.1)
        if missing:
            names = ", ".join(str(n) for n in missing)
            raise WorkerFailed(
                f"the agent of node{'s' * (len(missing) > 1)} {names} never came within {wait_s:g} s "
                f"(run.controller_wait_s; start `resihp agent --controller HOST:PORT --node-rank K` there)",
                [],
                [],
            )
        self.live, self.admitted = set(range(self.nodes)), True

    def spawn(self, device: int, blob: bytes) -> None:
        node = self.node_of(device)
        if node not in self.live:  # a dead node: its restarted agent must come within the start timeout
            self.liveness.spawn(node, self.clock())
            self.live.add(node)
        self.pid.pop(device, None)
        self.code[device] = None
        self.transport.commands(node).send(Spawn(device, blob))

    def on_spawned(self, msg) -> None:
        self.pid[msg.device] = msg.pid  # (another host's pid: never in `pids`, never signalled here)

    def lost(self, now: float) -> dict[int, list[int]]:
        out = {}
        for node in [n for n in self.liveness.hung(now) if n in self.live]:
            self.live.discard(node)
            self.liveness.forget(node)
            self.transport.fence(node)
            for channel in (self.transport.commands(node), self.transport.beats(node)):
                channel.queue.delete()
            devs = sorted(d for d, c in self.code.items() if c is None and self.node_of(d) == node)
            for d in devs:
                self.code[d] = -signal.SIGKILL
            out[node] = devs
        return out

    def kill(self, device: int) -> None:
        self.transport.commands(self.node_of(device)).send(Kill(device))

    def shutdown(self, grace_s: float) -> None:
        channels = [self.transport.commands(node) for node in sorted(self.live)]
        for channel in channels:
            channel.send(Shutdown(grace_s))
        deadline = time.monotonic() + grace_s + AGENT_EXIT_S
        while any(len(c.queue) for c in channels) and time.monotonic() < deadline:
            time.sleep(0.02)
        self.live.clear()

    def fence(self, wait_s: float = 0.0) -> None:
        """Nothing to do here: an agent reaps its own members (and fences itself without us)."""
