"""The controller's member processes: spawning, liveness verdicts, deaths, failing the job, shutdown.

Torch-free. The controller (`controller.py`) reads every message through `Processes.inbox`, hands
each to `Processes.dispatch` — the one table of every kind it can receive: its own handlers for the
members' messages, this module's for the agents' reports — and asks, at every turn of its loop, for
the verdicts (`check_alive`) and the members that died (`dead`):

* Agents: forked on this host (`agent.Agents`, `resihp train`) or started on their machines and
  admitted before the job starts (`remote.RemoteAgents`, `resihp controller`; `hosting.Hosting`).
* Liveness (`liveness.py`): every member beats every 0.25 s (through its agent, or by any message to
  the controller: `Inbox`'s `heard`, on arrival); one silent for
  `heartbeat_timeout_s` is hung (a frozen process, a hung device) and its agent SIGKILLs it — its
  sockets close, so peers blocked in a collective with it fail at once — and from then on it is a
  fail-stop (`"cause": "heartbeat"`; a process that exited by itself: `"cause": "exit"`). Silence
  counts on the `liveness.ListeningClock`: a pause of the controller itself is not a silence of
  the agents paused with it. A member
  with no first heartbeat within `start_timeout_s` of its spawn fails the job (`WorkerFailed`). An
  agent that exits or is silent for `heartbeat_timeout_s` is a dead node: every device of it is a
  fail-stop (`"cause": "node"`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from ..job import WorkerFailed
from .agent import Agents
from .hosting import Hosting
from .liveness import Inbox, ListeningClock, Liveness, agent_beat
from .protocol import ABORT_HUNG_EXIT, FROM_MEMBER, TO_CONTROLLER, AgentBeat, Dispatch, Kind
from .remote import RemoteAgents
from .transport import Channel, Transport


class Processes:
    """One agent per node (`agent.Agents`), the members' `liveness`, the `inbox` of their messages
    and the `dispatch` table. `handlers`: the controller's, one per member message kind
    (`protocol.FROM_MEMBER`); `results`: the controller's inbox channel; `clock`: the raw clock of
    the liveness (`ListeningClock` leaves the controller's own pauses out of it).

    `done`: devices whose member said done; `stopping`: device -> wall-clock time its member stopped
    (its own `Stopping` report, or silent since, for one killed); `killed`: device -> why the
    controller killed it (heartbeat | node). A spawn clears the device's `stopping` and `killed`.
    """

    def __init__(
        self,
        transport: Transport | None,
        results: Channel,
        liveness: Liveness,
        devices_per_node: int | None,
        timeout_s: float,
        start_timeout_s: float,
        handlers: Mapping[Kind, Callable],
        clock: Callable[[], float] = time.monotonic,
        hosting: Hosting | None = None,
    ) -> None:
        self.liveness, self.start_timeout_s = liveness, start_timeout_s
        self.clock = clock = ListeningClock(clock)  # (members' and agents' liveness alike)
        self.hosting = hosting = hosting or Hosting()
        if hosting.nodes is None:  # the embedded agents: forked on this host as nodes get members
            self.agents = Agents(
                transport, devices_per_node, timeout_s, start_timeout_s, hosting.controller_timeout_s, clock
            )
        else:
            self.agents = RemoteAgents(
                transport, devices_per_node, timeout_s, start_timeout_s, hosting.nodes, clock
            )
        assert set(handlers) == FROM_MEMBER, sorted(k.value for k in handlers)
        own = {
            Kind.AGENT: self.on_agent,
            Kind.SPAWNED: self.agents.on_spawned,
            Kind.EXITED: self.agents.on_exited,
        }
        self.dispatch = Dispatch({**handlers, **own}, TO_CONTROLLER)
        self.inbox = Inbox(results, self.dispatch, lambda msg: liveness.beat(msg.device, clock()))
        self.done: set[int] = set()
        self.stopping: dict[int, float] = {}
        self.killed: dict[int, str] = {}  # device -> why the controller killed it (heartbeat | node)

    def spawn(self, dev: int, blob: bytes) -> None:
        """Have the device's agent start a member; before the first, agents started elsewhere must
        have registered (`RemoteAgents.admit`)."""
        if isinstance(self.agents, RemoteAgents) and not self.agents.admitted:
            self.agents.admit(self.inbox.drain, self.hosting.wait_s)
        self.agents.spawn(dev, blob)
        self.liveness.spawn(dev, self.clock())
        self.stopping.pop(dev, None)
        self.killed.pop(dev, None)

    def on_agent(self, msg: AgentBeat) -> None:
        agent_beat(msg, self.liveness, self.agents.liveness, self.clock())

    def cause(self, dev: int) -> str:
        """Why the member of `dev` died: "heartbeat" or "node" (the controller killed it), "abort-hung"
        (its NCCL abort did not return: `protocol.ABORT_HUNG_EXIT`), else "exit"."""
        if self.agents.exitcode(dev) == ABORT_HUNG_EXIT:
            return "abort-hung"
        return self.killed.get(dev, "exit")

    def finish(self, dev: int) -> None:
        """The member of `dev` said done."""
        self.done.add(dev)
        self.liveness.forget(dev)

    def dead(self, members: set[int]) -> list[int]:
        """Members whose process died; exit code 0: a member that finished (its "done" may still be in
        the queue)."""
        return sorted(d for d in members if d not in self.done and self.agents.exitcode(d) not in (None, 0))

    def check_alive(self, members: set[int]) -> None:
        """Have members silent for longer than the heartbeat timeout killed, and fence the nodes
        whose agent died or went silent (their devices become fail-stops); fail the job when a
        spawned member or agent never sent its first heartbeat."""
        now, agents, liveness = self.clock(), self.agents, self.liveness
        for d in liveness.hung(now):
            if d in members and d not in self.done and agents.exitcode(d) is None:
                agents.kill(d)  # SIGKILL works on a stopped process too; its agent reports the exit
                self.killed[d] = "heartbeat"
                self.stopping.setdefault(d, time.time() - (now - liveness.last[d]))  # silent since
            liveness.forget(d)
        heard = dict(agents.liveness.last)  # each agent's last beat, before `lost` forgets the dead
        for node, devs in agents.lost(now).items():  # fenced: their processes are dead
            for d in devs:
                self.killed[d] = "node"
                if node in heard:
                    self.stopping.setdefault(d, time.time() - (now - heard[node]))  # silent since
                liveness.forget(d)
        late = [d for d in liveness.unstarted(now) if agents.exitcode(d) is None]
        who = [f"worker of device {d}" for d in late] + [f"agent of node {n}" for n in agents.unstarted(now)]
        if who:
            raise WorkerFailed(
                "; ".join(f"{w} sent no heartbeat within {self.start_timeout_s:g} s" for w in who),
                late,
                agents.pids,
            )

    def fail(self, errors: dict[int, str]) -> None:
        """Raise WorkerFailed blaming, first, members that died without a word (the likely root
        cause: their peers' collectives then fail with "connection closed"), then those that
        raised; it first waits 1 s for the other consequences of one failure to arrive. The first
        line of the message names every member blamed; the tracebacks follow."""
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            self.inbox.drain(0.1)
        errors.update({m.device: m.traceback for m in self.inbox.pending if m.kind is Kind.ERROR})
        code = self.agents.exitcode
        dead = [d for d in sorted(self.agents.code) if d not in self.done and d not in errors and code(d)]
        heads = [f"worker of device {d} died (exit code {code(d)})" for d in dead]
        heads += [f"worker of device {d} failed ({_last_line(tb)})" for d, tb in sorted(errors.items())]
        tracebacks = [
            f"worker of device {d}:\n{tb}" for d, tb in sorted(errors.items()) if "\n" in tb.strip()
        ]
        message = "\n".join(["; ".join(heads), *tracebacks])
        raise WorkerFailed(message, dead + sorted(errors), self.agents.pids)

    def close(self, grace_s: float) -> None:
        """Shut the agents down (their members get `grace_s` to exit by themselves), read their last
        reports (every pid), kill a member that outlived its agent."""
        self.agents.shutdown(grace_s)
        self.inbox.drain()
        self.agents.fence()


def _last_line(text: str) -> str:
    """The last non-empty line of `text` (of a traceback: the exception)."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "?"
