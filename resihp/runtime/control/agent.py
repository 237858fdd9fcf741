"""Node agents: one process per node spawns that node's member processes and watches them.

The paper's node-local monitor; the controller (`controller.py`) is the central coordinator. Devices
are grouped into nodes by `device // devices_per_node` (`run.devices_per_node`; default: every device
on one node). An agent (`agent_main`, one process per node)

* spawns members on the controller's commands, read from its own command channel (`Spawn`, `Kill`,
  `Shutdown`). It starts them through its own forkserver, which preloads torch once per node (the
  agents of a job preload in parallel); the agent itself never imports torch: a member's arguments
  travel as one opaque `blob`;
* polls its members' exit codes every `EXIT_POLL_S` and reports each exit (`Exited`) at once, and
  every spawn (`Spawned`);
* receives its members' `Heartbeat`s on its own channel and forwards them, with its own, every
  `HEARTBEAT_S` as an `AgentBeat` (device -> arrival of its last beat, agent clock): who is hung is
  judged in one place, the controller's `liveness.Liveness`;
* reaps its members when it shuts down, when it fails, and when the controller is gone; a member
  exits when its agent is gone (`pids.watch`), so a dead agent — a dead node — takes its workers down.

`Agents` is the controller's side: it starts an agent when a node gets its first member (a re-join
on a dead node starts a new one), sends the commands, keeps the process table from the reports
(`on_spawned`, `on_exited`), declares a node dead when its agent exits or is silent for the
heartbeat timeout (`lost`), fencing it first — the agent and the members it reported are killed,
as a real node's processes are gone with it — and shuts the agents down at the end.

Torch-free. Single host: the channels are those of `transport.py` (one host's queues), and fencing
and the orphan checks use local pids; agents on other hosts need another transport (not built).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time

from .liveness import HEARTBEAT_S, Liveness
from .pids import WATCH_S, kill_tree, running, watch
from .pids import kill as kill_pid
from .protocol import (
    TO_AGENT,
    TO_AGENT_BEATS,
    AgentBeat,
    Dispatch,
    Exited,
    Heartbeat,
    Kill,
    Kind,
    Shutdown,
    Spawn,
    Spawned,
)
from .signals import quiet_children, shield, shielded
from .transport import Channel, Transport

# what a node's forkserver imports once, in order (`preload` last: it freezes the others out of the gc)
MEMBER_PRELOAD = ["resihp.runtime.control.member", "torch._dynamo", "resihp.runtime.control.preload"]
EXIT_POLL_S = 0.05  # an agent sees a member's exit within this
AGENT_EXIT_S = 1.0  # after its members' grace, an agent that has not exited is killed with its tree


def _member(blob: bytes, beats, results, agent: int) -> None:
    """A member process's entry point (`member.member_main`, preloaded by the node's forkserver)."""
    from .member import member_main

    member_main(blob, beats, results, agent)


def agent_main(
    node: int, commands: Channel, beats: Channel, results: Channel, controller: int,
    heartbeat_s: float = HEARTBEAT_S,
) -> None:  # fmt: skip
    """The agent process of `node` (non-daemonic: it has children); runs until `Shutdown`.
    `beats`: its members' heartbeat channel (made by the controller, so that a killed agent leaks
    nothing). SIGINT and SIGTERM are ignored here and in the members (`signals.shield`): the
    controller stops them; members log torch's C++ messages from ERROR up (`signals.quiet_children`)."""
    shield()
    quiet_children()  # before the forkserver (and torch in it) starts
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(MEMBER_PRELOAD)
    procs: dict = {}  # device -> its current member process
    last: dict[int, float] = {}  # device -> arrival of its current process's last heartbeat
    lock = threading.Lock()  # procs and last, shared with the forwarding thread
    stop = threading.Event()
    shutdown: list[float] = []  # the deadline of a `Shutdown`, once received

    def orphaned() -> None:  # the controller is gone: no member outlives it
        with lock:
            pids = [p.pid for p in procs.values()]
        for pid in pids:
            kill_pid(pid)
        os._exit(3)

    def on_heartbeat(msg: Heartbeat) -> None:
        with lock:
            if msg.device in procs and procs[msg.device].pid == msg.pid:  # not a killed predecessor's
                last[msg.device] = time.monotonic()

    def forward() -> None:
        table = Dispatch({Kind.HEARTBEAT: on_heartbeat}, TO_AGENT_BEATS)
        while not stop.is_set():
            msg = beats.recv()
            while msg is not None:
                table(msg)
                msg = beats.recv()
            with lock:
                seen = dict(last)
            try:
                results.send(AgentBeat(node, time.monotonic(), seen))
            except (ValueError, OSError):  # closed: the agent is exiting
                return
            stop.wait(heartbeat_s)

    def on_spawn(msg: Spawn) -> None:
        args = (msg.blob, beats, results, os.getpid())
        p = ctx.Process(target=_member, args=args, name=f"member-{msg.device}", daemon=True)
        p.start()
        with lock:
            procs[msg.device] = p
            last.pop(msg.device, None)
        results.send(Spawned(msg.device, p.pid, node))

    def on_kill(msg: Kill) -> None:
        if msg.device in procs:
            procs[msg.device].kill()  # SIGKILL ends a stopped (frozen) process too; its sockets close
            procs[msg.device].join(5.0)

    def on_shutdown(msg: Shutdown) -> None:
        deadline = time.monotonic() + msg.grace_s  # let finishing members exit by themselves
        for p in list(procs.values()):
            p.join(max(0.0, deadline - time.monotonic()))
        shutdown.append(deadline)

    table = Dispatch({Kind.SPAWN: on_spawn, Kind.KILL: on_kill, Kind.SHUTDOWN: on_shutdown}, TO_AGENT)
    watch(controller, orphaned)
    beat = threading.Thread(target=forward, name="agent-heartbeat", daemon=True)
    beat.start()  # beats even while the first spawn waits for the forkserver's preload
    try:
        while not shutdown:
            msg = commands.recv(EXIT_POLL_S)
            if msg is not None:
                table(msg)
            if shutdown:
                break
            for dev, p in list(procs.items()):
                if p.exitcode is not None:
                    with lock:
                        del procs[dev]
                        last.pop(dev, None)
                    results.send(Exited(dev, p.exitcode, node, p.pid))
    finally:  # also on an error of ours (the process prints it and exits 1: the controller sees a dead node)
        for p in list(procs.values()):
            p.kill()
        for p in list(procs.values()):
            p.join(5.0)
        stop.set()
        beat.join(1.0)
        results.flush()  # every report delivered before the process ends


class Agents:
    """The controller's side of the node agents: starting them, commands, the process table, dead
    nodes, shutdown. `pids` lists every process started (agents and the members they reported)."""

    def __init__(
        self,
        transport: Transport | None,
        results: Channel | None,
        devices_per_node: int | None,
        timeout_s: float,
        start_timeout_s: float,
    ) -> None:
        """`transport` makes each node's channels; `results`: the controller's inbox."""
        self.transport, self.results, self.per = transport, results, devices_per_node
        self.ctx = mp.get_context("spawn")  # a fresh interpreter: the agent never imports torch
        self.procs: dict = {}  # node -> its agent process
        self.commands: dict[int, Channel] = {}  # node -> its command channel
        self.beats: dict[int, Channel] = {}  # node -> its members' heartbeat channel (kept: it lives)
        self.liveness = Liveness(timeout_s, start_timeout_s)  # of the agents, fed by `liveness.agent_beat`
        self.pid: dict[int, int] = {}  # device -> pid of its current process, once reported
        self.code: dict[int, int | None] = {}  # device -> exit code of its current process (None: runs)
        self.pids: list[int] = []

    def node_of(self, device: int) -> int:
        return 0 if self.per is None else device // self.per

    def spawn(self, device: int, blob: bytes) -> None:
        """Have the device's node agent start a member process with `blob`; starts the agent first
        when the node has none (its first member, or a re-join on a node that died)."""
        node = self.node_of(device)
        if node not in self.procs:
            commands, beats = self.transport.channel(), self.transport.channel()
            args = (node, commands, beats, self.results, os.getpid())
            proc = self.ctx.Process(target=agent_main, args=args, name=f"resihp-agent-{node}")
            with shielded():  # no SIGINT may reach the agent before it ignores it
                proc.start()
            self.procs[node], self.commands[node], self.beats[node] = proc, commands, beats
            self.pids.append(proc.pid)
            self.liveness.spawn(node, time.monotonic())
        self.pid.pop(device, None)
        self.code[device] = None
        self.commands[node].send(Spawn(device, blob))

    def kill(self, device: int) -> None:
        """SIGKILL the device's process (its agent reports the exit)."""
        self.commands[self.node_of(device)].send(Kill(device))

    def exitcode(self, device: int) -> int | None:
        """The exit code of the device's current process; None while it runs (or was never started)."""
        return self.code.get(device)

    def on_spawned(self, msg: Spawned) -> None:
        self.pid[msg.device] = msg.pid
        self.pids.append(msg.pid)

    def on_exited(self, msg: Exited) -> None:
        if self.pid.get(msg.device) == msg.pid:  # not the exit of a process the device had before
            self.code[msg.device] = msg.code

    def lost(self, now: float) -> dict[int, list[int]]:
        """Nodes declared dead now — the agent exited, or was silent for the heartbeat timeout — ->
        their devices whose process ran. The node is fenced first: its agent and those processes are
        SIGKILLed (on one host; a dead machine's processes are gone with it)."""
        hung = set(self.liveness.hung(now))
        out = {}
        for node, proc in list(self.procs.items()):
            if proc.exitcode is None and node not in hung:
                continue
            proc.kill()
            proc.join()
            self.commands.pop(node).abandon()  # nobody reads it any more
            del self.procs[node], self.beats[node]
            self.liveness.forget(node)
            devs = sorted(d for d, c in self.code.items() if c is None and self.node_of(d) == node)
            for d in devs:
                if d in self.pid:
                    kill_pid(self.pid[d])
                self.code[d] = -signal.SIGKILL
            out[node] = devs
        return out

    def unstarted(self, now: float) -> list[int]:
        """Nodes whose agent sent no heartbeat within the start timeout."""
        return self.liveness.unstarted(now)

    def shutdown(self, grace_s: float) -> None:
        """Ask every agent to give its members up to `grace_s` to exit, reap them and exit; an agent
        that has not `AGENT_EXIT_S` later — blocked, say, in its first spawn while its forkserver
        preloads torch, seconds — is SIGKILLed with its whole tree (forkserver and members)."""
        for channel in self.commands.values():
            channel.send(Shutdown(grace_s))
        deadline = time.monotonic() + grace_s + AGENT_EXIT_S
        for proc in self.procs.values():
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.exitcode is None:
                kill_tree(proc.pid)
                proc.join()
        for channel in self.commands.values():
            channel.close()
        self.procs.clear()
        self.commands.clear()
        self.beats.clear()

    def fence(self, wait_s: float = 2 * WATCH_S + 0.5) -> None:
        """After `shutdown` (and the last reports read): SIGKILL every reported member still running
        once its watchdog had `wait_s` to notice its agent is gone — none, unless an agent was killed."""
        left = [self.pid[d] for d, c in self.code.items() if c is None and d in self.pid]
        deadline = time.monotonic() + wait_s
        while any(running(p) for p in left) and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in left:
            if running(pid):
                kill_pid(pid)
