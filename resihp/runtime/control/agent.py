"""Node agents: one process per node spawns that node's member processes and watches them.

The paper's node-local monitor; the controller (`controller.py`) is the central coordinator. Devices
are grouped into nodes by `device // devices_per_node` (`run.devices_per_node`; default: every device
on one node). An agent (`agent_main`, one process per node)

* spawns members on the controller's commands, read from its node's command channel (`Spawn`,
  `Kill`, `Shutdown`). It starts them through its own forkserver, which preloads torch once per node
  (the agents of a job preload in parallel); the agent itself never imports the model: a member's
  arguments travel as one opaque `blob` (it imports torch.distributed only for the store client);
* reads each of the controller's decisions once from the store and hands it to every member of the
  node that asks, over a pipe of its own (`relay.DecisionRelay`);
* polls its members' exit codes every `EXIT_POLL_S` and reports each exit (`Exited`) at once, and
  every spawn (`Spawned`);
* receives its members' `Heartbeat`s on its node's heartbeat channel and forwards them, with its
  own, every `HEARTBEAT_S` as an `AgentBeat` (device -> arrival of its last beat, agent clock): who
  is hung is judged in one place, the controller's `liveness.Liveness`, by arrival on its own clock;
* fences itself when the controller is gone — out of reach for `controller_timeout_s` (`Reach`),
  or, for an agent forked on the controller's host, its parent dead — or fenced the node: kills
  its members and exits (out of reach: returns, and `resihp agent` waits for a new controller,
  `serve.py`); a member exits when its agent is gone (`pids.watch`, on its own host), so a dead
  agent — a dead node — takes its workers down.

Every channel is the controller's store (`transport.py`), named by node rank: what an agent says
and hears crosses no other wire (the decision pipes stay on the node and carry the store's bytes),
and it never compares its clock with another host's.

`Agents` is the controller's side: it starts an agent when a node gets its first member (a re-join
on a dead node starts a new one), sends the commands, keeps the process table from the reports
(`on_spawned`, `on_exited`), declares a node dead when its agent exits or is silent for the
heartbeat timeout (`lost`), fencing it first — the agent and the members it reported are killed,
as a real node's processes are gone with it — and shuts the agents down at the end.

Torch-free at import. The agents `Agents` starts run on the controller's host (it kills them and
their members by pid when it fences them).
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import multiprocessing.forkserver as forkserver
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

from .liveness import HEARTBEAT_S, Liveness
from .pids import WATCH_S, kill_tree, orphaned, running
from .pids import kill as kill_pid
from .protocol import (
    PG_TIMEOUT_S,
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
from .relay import DecisionRelay
from .signals import STOP_SIGNALS, quiet_children, shield, shielded
from .transport import Transport, Unreachable, load_quietly

# what a node's forkserver imports once, in order (`preload` last: it freezes the others out of the gc)
MEMBER_PRELOAD = ["resihp.runtime.control.member", "torch._dynamo", "resihp.runtime.control.preload"]
EXIT_POLL_S = 0.05  # an agent sees a member's exit within this
AGENT_EXIT_S = 1.0  # after its members' grace, an agent that has not exited is killed with its tree
CONTROLLER_TIMEOUT_S = 2.0  # default `run.controller_timeout_s`: an agent fences itself after this
FENCED_EXIT = 3  # exit code of an agent that lost its controller and killed its members


def _member(blob: bytes, beats, results, agent: int, decisions) -> None:
    """A member process's entry point (`member.member_main`, preloaded by the node's forkserver)."""
    from .member import member_main

    member_main(blob, beats, results, agent, decisions)


class Reach:
    """Whether the controller is still reachable, on this agent's clock: `ok()` after every call that
    reached the store, `lost()` once none did for `timeout_s` since the first failure."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s, self.failing = timeout_s, None

    def ok(self) -> None:
        self.failing = None

    def lost(self) -> bool:
        now = time.monotonic()
        if self.failing is None:
            self.failing = now
        return now - self.failing >= self.timeout_s


def agent_main(
    node: int, transport: Transport, controller_timeout_s: float = CONTROLLER_TIMEOUT_S,
    heartbeat_s: float = HEARTBEAT_S, say: bool = False, child: bool = False, then: str = "exiting",
) -> int:  # fmt: skip
    """The agent of `node` (non-daemonic: it has children); runs until `Shutdown`, returns 0. Its
    channels are the store's of its node rank (`transport`). SIGINT and SIGTERM are ignored in the
    members (`signals.shield`) and, but with `say` (a `resihp agent` of its own), here: the
    controller stops them; members log torch's C++ messages from ERROR up (`signals.quiet_children`).

    Fencing: when no call reached the store for `controller_timeout_s`, or the controller fenced
    the node (its fence counter, `Transport.fences`, moved past the value the agent started
    with), the agent SIGKILLs its members (with `say`, then one line on stderr; an agent forked by
    `resihp train` dies quietly with its controller), so no member of a node cut off from its
    controller outlives the timeout, nor serves on once fenced. Fenced by the controller, it exits
    `FENCED_EXIT`; out of reach, it reaps its members, stops its heartbeat thread and returns
    `FENCED_EXIT` — its line ends with `then`, what its caller does next (`serve` waits for a new
    controller) — with the signal handlers it found (a SIGINT / SIGTERM that came meanwhile is
    raised again there); its forkserver stays up for the next run of `agent_main`. With `child`
    (an agent the controller forked on its own host), it fences as soon as its parent is gone
    (`pids.orphaned`, within `pids.WATCH_S`) and exits, instead of on the store's silence (on one
    host a late store is load, not a partition). With `say`, SIGINT / SIGTERM kill the members and
    exit 130 / 143 after one line."""
    found = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    shield()
    user_level = "TORCH_CPP_LOG_LEVEL" in os.environ
    quiet_children()  # before the forkserver (and torch in it) starts
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(MEMBER_PRELOAD)
    forkserver.ensure_running()  # it preloads torch while this process imports its store client
    load_quietly(user_level)  # the agent's own reconnect attempts say nothing (`fenced` says one line)
    # torch's objects, frozen out of the collector: a full collection over them held this process's
    # GIL, and its heartbeat thread with it, for 0.2-0.8 s at load average 9-23 on 2 cores (as
    # the members do: `preload.py`)
    gc.freeze()
    commands, beats, results = transport.commands(node), transport.beats(node), transport.inbox()
    relay = DecisionRelay(transport.host, transport.port, PG_TIMEOUT_S)  # the members' decisions
    procs: dict = {}  # device -> its current member process
    last: dict[int, float] = {}  # device -> arrival of its current process's last heartbeat
    lock = threading.Lock()  # procs and last, shared with the forwarding thread
    stop = threading.Event()
    shutdown: list[float] = []  # the deadline of a `Shutdown`, once received
    reach = Reach(controller_timeout_s)
    signals: list[int] = []  # with `say`: SIGINT / SIGTERM received

    where = f"controller at {transport.host}:{transport.port}"

    def fence(why: str, next_: str) -> None:
        with lock:  # no member outlives its fenced node
            pids = [p.pid for p in procs.values()]
        for pid in pids:
            kill_pid(pid)
        if say:
            print(
                f"resihp agent: node {node}: {why}; killed {len(pids)} member(s), {next_}",
                file=sys.stderr, flush=True,
            )  # fmt: skip

    def fenced(why: str, code: int = FENCED_EXIT) -> None:
        fence(why, "exiting")
        os._exit(code)

    try:
        baseline = transport.fences(node)
    except Unreachable:
        fenced(f"{where} unreachable")
    if say:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda signum, frame: signals.append(signum))

    def on_heartbeat(msg: Heartbeat) -> None:
        with lock:
            if msg.device in procs and procs[msg.device].pid == msg.pid:  # not a killed predecessor's
                last[msg.device] = time.monotonic()

    def forward() -> None:
        table = Dispatch({Kind.HEARTBEAT: on_heartbeat}, TO_AGENT_BEATS)
        while not stop.is_set():
            try:
                msg = beats.recv()
                while msg is not None:
                    table(msg)
                    msg = beats.recv()
                with lock:
                    seen = dict(last)
                results.send(AgentBeat(node, time.monotonic(), seen))
                if transport.fences(node) != baseline:
                    fenced(f"{where} fenced this node (silent for longer than its heartbeat timeout)")
            except Unreachable:  # the main loop judges (and fences)
                pass
            stop.wait(heartbeat_s)

    def on_spawn(msg: Spawn) -> None:
        decisions = relay.connect()
        args = (msg.blob, beats, results, os.getpid(), decisions)
        p = ctx.Process(target=_member, args=args, name=f"member-{msg.device}", daemon=True)
        p.start()
        decisions.close()  # (the member holds its end)
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
    if child:
        orphaned(lambda: fenced(f"{where} gone"))
    beat = threading.Thread(target=forward, name="agent-heartbeat", daemon=True)
    beat.start()  # beats even while the first spawn waits for the forkserver's preload
    lost = False
    try:
        while not shutdown:
            try:
                msg = commands.recv(EXIT_POLL_S)
                reach.ok()
                if msg is not None:
                    table(msg)
                if shutdown:
                    break
                for dev, p in list(procs.items()):
                    if p.exitcode is not None:  # reported first: a report that did not go is retried
                        results.send(Exited(dev, p.exitcode, node, p.pid))
                        with lock:
                            del procs[dev]
                            last.pop(dev, None)
            except Unreachable:  # (an agent forked here follows its parent instead: `orphaned`)
                if not child and reach.lost():
                    fence(f"{where} unreachable for {controller_timeout_s:g} s", then)
                    lost = True
                    break
                time.sleep(EXIT_POLL_S)
            if signals:
                name = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}[signals[0]]
                fenced(name, 128 + signals[0])
    finally:  # also on an error of ours (the process prints it and exits 1: the controller sees a dead node)
        for p in list(procs.values()):
            p.kill()
        for p in list(procs.values()):
            p.join(5.0)
        stop.set()
        relay.close()
        beat.join(None if lost else 1.0)  # (its store calls time out) none outlives this run of it
    if not lost:
        return 0
    for sig, handler in found.items():
        signal.signal(sig, handler)
    if signals:
        signal.raise_signal(signals[0])
    return FENCED_EXIT


class Agents:
    """The controller's side of the node agents: starting them, commands, the process table, dead
    nodes, shutdown. `pids` lists every process started (agents and the members they reported)."""

    def __init__(
        self,
        transport: Transport | None,
        devices_per_node: int | None,
        timeout_s: float,
        start_timeout_s: float,
        controller_timeout_s: float = CONTROLLER_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`transport`: the store's channels; `controller_timeout_s`: the agents' (`agent_main`);
        `clock`: the liveness clock (the controller's `liveness.ListeningClock`)."""
        self.transport, self.per, self.clock = transport, devices_per_node, clock
        self.controller_timeout_s = controller_timeout_s
        self.ctx = mp.get_context("spawn")  # a fresh interpreter: the agent never imports the model
        self.procs: dict = {}  # node -> its agent process
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
            args = (node, self.transport, self.controller_timeout_s, HEARTBEAT_S, False, True)
            proc = self.ctx.Process(target=agent_main, args=args, name=f"resihp-agent-{node}")
            with shielded():  # no SIGINT may reach the agent before it ignores it
                proc.start()
            self.procs[node] = proc
            self.pids.append(proc.pid)
            self.liveness.spawn(node, self.clock())
        self.pid.pop(device, None)
        self.code[device] = None
        self.transport.commands(node).send(Spawn(device, blob))

    def kill(self, device: int) -> None:
        """SIGKILL the device's process (its agent reports the exit)."""
        self.transport.commands(self.node_of(device)).send(Kill(device))

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
        SIGKILLed (on one host; a dead machine's processes are gone with it), and its channels are
        emptied, so that a fresh agent of the node reads no command meant for the dead one."""
        hung = set(self.liveness.hung(now))
        out = {}
        for node, proc in list(self.procs.items()):
            if proc.exitcode is None and node not in hung:
                continue
            proc.kill()
            proc.join()
            for channel in (self.transport.commands(node), self.transport.beats(node)):
                channel.queue.delete()
            del self.procs[node]
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
        for node in self.procs:
            self.transport.commands(node).send(Shutdown(grace_s))
        deadline = time.monotonic() + grace_s + AGENT_EXIT_S
        for proc in self.procs.values():
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.exitcode is None:
                kill_tree(proc.pid)
                proc.join()
        self.procs.clear()

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
