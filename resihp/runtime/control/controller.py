"""Controller of the elastic runtime: commits iterations, publishes Plan generations, survives stops.

The controller (the calling process) hosts the `TCPStore`, the only wire, and reads the members'
messages; one agent per node (`agent.py`, `hosting.py`) spawns, watches, kills and reaps that
node's member processes (`member.py`). docs/runtime.md tells the whole protocol; in short:

* Commit: iteration k of generation g is committed when every plan device of g reported `Reached`;
  the controller writes `decision/{g}/{k}` = `Verdict.COMMIT` (or `NEXT` after publishing
  `plan/{g+1}` for a replan due at k + 1). Time-keyed faults due and `duration_s` ends are
  resolved there (`faults.TimedFaults`, on a clock that starts at the first `go`).
* Liveness (`processes.py`): a member silent for `heartbeat_timeout_s` is killed, a node whose
  agent died or went silent is fenced; either way its devices become fail-stops.
* Fail-stop: the first death writes `ABORT` for the iteration in flight (and any generation before its
  rendezvous); once quiescent (`failover.Failover`) the scheduler plans g+1 over the survivors
  (`reconfig.replan_after_stop`; from the newest checkpoint when no live copy is left: `adapt/restart.py`).
  A failed collective while no process died, or a member error, ends the job (`WorkerFailed`).
* Join barrier: members of g start its gloo rendezvous once `go/{g}` says so (every member arrived,
  alive); a death first supersedes g (`Gate.ABORT`). The next generation transfers from the last
  one every survivor joined (`recovery.source_generation`).
* Events are made in one place (`events.EventLog`) and handed on as they happen. A job that stops
  early (`WorkerFailed`, or SIGINT / SIGTERM: `signals.StopSignals` raises `Interrupted` at the
  next turn of the loop) is torn down in order and ends with a `job-failed` / `interrupted` event;
  the exception carries what the run had (`output`).

Every message has its one method `on_<kind>` in the one dispatch table (`Processes.dispatch`,
`protocol.Dispatch`); a kind without one raises.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from resihp.core.faults import FaultSpec
from resihp.core.plan import Plan
from resihp.sched.base import Policy
from resihp.sched.ours import ResiHP

from ..adapt.reconfig import grow_plan, planning_context, replan_after_slow
from ..adapt.recovery import advice, mark_noticed, plan_after_stop
from ..adapt.restart import Restart, rewind
from ..adapt.rollback import Snapped
from ..adapt.slowwatch import slow_event, watch_job
from ..faults import FaultEnd, TimedFaults, end_event
from ..job import Interrupted, JobSpec, WorkerFailed
from ..state.checkpoint import savers, write_meta
from ..state.moved import transfer_event
from ..state.transfer import gather_replicas
from .board import Board
from .boundaries import Boundaries
from .events import EventLog
from .failover import Failover
from .hosting import Hosting
from .liveness import HEARTBEAT_TIMEOUT_S, START_TIMEOUT_S, JoinBarrier, Liveness
from .processes import Processes
from .protocol import (
    FROM_MEMBER,
    Abort,
    Decision,
    Done,
    Error,
    Gate,
    Generation,
    Joined,
    Joining,
    MemberArgs,
    Reached,
    Record,
    Saved,
    State,
    Stopping,
    Verdict,
)
from .records import RecordStore
from .records import decode as decode_record
from .signals import StopSignals
from .transport import Transport

DEFAULT_POLICY = ResiHP()  # policies are pure: one instance serves every run


def launch_elastic(
    plan: Plan,
    job: JobSpec,
    *,
    faults=(),
    replans: list[tuple[int, Plan]] | tuple = (),
    on_commit: Callable[[int, Plan, list[Reached]], None] | None = None,
    on_event: Callable[[dict, list[Plan]], None] | None = None,
    detect_slow: bool = False,
    policy: Policy | None = DEFAULT_POLICY,
    heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S,
    start_timeout_s: float = START_TIMEOUT_S,
    devices_per_node: int | None = None,
    hosting: Hosting | None = None,
    trace: str | None = None,
) -> dict:
    """Run `job` from `plan` (generation 0), switching to each `(iteration, plan)` of `replans` at
    that iteration boundary and recovering from member deaths (docs/runtime.md).

    `on_commit(it, plan, reached)`: once per committed iteration, with each plan device's `Reached`
    (`losses`, `wall_s`; device order). `on_event(event, plans)`: once per event as it is made
    (`plans`: every generation's so far), and again for a `fail-stop` once its recovery is measured
    (`recovery` added). `faults` (checked by `core.faults.check_faults`) may be time-keyed
    (`TimedFaults`). With `detect_slow`, committed iterations' compute (and, with
    `job.link_mb_per_s`, P2P) timings go to `SlowWatch`, whose `fail-slow` / `link-slow` reports
    go to `policy` (`reconfig.replan_after_slow`), as do fail-stops (`reconfig.replan_after_stop`);
    `policy` None: the `rebalance_slow` / `shrink_plan` rules. A member silent for
    `heartbeat_timeout_s` is killed (a fail-stop); one with no heartbeat `start_timeout_s` after
    its spawn fails the job. Devices with the same `d // devices_per_node` (None: all) form a node
    with one agent (`hosting`: where the store listens, where agents come from; None: forked here).
    The trace records stream to the file `trace` (JSON lines, the committed history; None: kept
    nowhere) as iterations settle; the controller holds a window only (`records.RecordStore`).

    Returns {"state": replica -> full state dict of the final plan (with `job.return_state`),
    "events" (in the order made), "plans", "pids": every agent and member process, "faults": (fault
    as given, iteration, seconds on the clock) of every time-keyed fault resolved}. A job that cannot
    go on raises `WorkerFailed`, one stopped by SIGINT or SIGTERM `Interrupted`; either carries that
    result up to the stop (`output`) and the way on (`advice`)."""
    return Controller(
        plan, job, faults=faults, replans=replans, on_commit=on_commit, on_event=on_event,
        detect_slow=detect_slow, policy=policy, heartbeat_timeout_s=heartbeat_timeout_s,
        start_timeout_s=start_timeout_s, devices_per_node=devices_per_node, hosting=hosting, trace=trace,
    ).run()  # fmt: skip


class Controller:
    """One run of `launch_elastic`: the controller's state, and one method `on_<kind>` per kind of
    member message (`handlers`, the member half of the dispatch table).

    `gen`, `cur`: the latest published generation and its plan; `it`: the iteration to commit next;
    `members`: the devices of the live member processes; `reached`: plan device -> its `Reached`
    message for `it` in `gen`; `plans`, `bodies`: every generation's plan and published body;
    `fails`: the failure not replanned yet and the recovery measured (`failover.Failover`);
    `records`: the trace records of the iterations not settled yet (`records.RecordStore`).
    """

    def __init__(
        self, plan: Plan, job: JobSpec, *, faults, replans,
        on_commit: Callable[[int, Plan, list[Reached]], None] | None,
        on_event: Callable[[dict, list[Plan]], None] | None, detect_slow: bool, policy: Policy | None,
        heartbeat_timeout_s: float, start_timeout_s: float, devices_per_node: int | None,
        hosting: Hosting | None = None, trace: str | None = None,
    ) -> None:  # fmt: skip
        self.plan, self.job, self.on_commit, self.policy = plan, job, on_commit, policy
        self.devices_per_node, self.end = devices_per_node, job.start_iteration + job.iterations
        self.timed = TimedFaults(faults, job.start_iteration, self.end)
        self.due = Boundaries(replans, self.timed.faults, self.end)
        hosting = hosting or Hosting(devices_per_node=devices_per_node)
        self.store = hosting.store()
        self.board = Board(self.store)
        self.transport = Transport(hosting.listen[0], self.store.port)
        self.gen, self.cur, self.it = 0, plan, job.start_iteration
        self.members = set(plan.devices()) | set(plan.standby)
        body0 = Generation(0, plan, tuple(sorted(self.members)), self.it, None, tuple(self.timed.faults))
        self.origin = None  # the fault clock: time.monotonic() when the first `go` was written
        self.shards, self.plans = {}, [plan]
        self.log = EventLog(self.plans, on_event)
        self.reached: dict[int, Reached] = {}
        self.joined: dict[int, list[Joined]] = {}  # generation -> its members' `Joined` messages
        self.finished = False  # the last iteration is committed
        self.watch = watch_job(self.plans, job) if detect_slow and job.timing else None
        self.saved: dict[tuple, set[int]] = {}  # (generation, iteration) -> savers that wrote
        liveness = Liveness(heartbeat_timeout_s, start_timeout_s)
        self.procs = Processes(
            self.transport, self.transport.inbox(), liveness, devices_per_node, heartbeat_timeout_s,
            start_timeout_s, self.handlers(), hosting=hosting,
        )  # fmt: skip
        self.barrier = JoinBarrier()
        self.barrier.open(0, self.members)
        self.joined_devs: dict[int, set[int]] = {}  # generation -> members that completed its join
        self.bodies: dict[int, Generation] = {0: body0}
        self.fails = Failover(self.board, self.barrier, Snapped(self.bodies))  # (failover.Failover)
        self.records = RecordStore(trace)  # last: it opens the trace file (closed by `run`)

    def run(self) -> dict:
        """Spawn generation 0's members, then handle deaths, the join barrier and every message until
        the last iteration is committed and every member said done."""
        try:
            with StopSignals(self.procs.agents.pids) as signals:
                try:
                    self.log.inject(self.timed, self.it)
                    for dev in sorted(self.members):
                        self.spawn(dev, self.bodies[0])
                    while not (self.finished and self.procs.done >= self.members):
                        msg = self.procs.inbox.get(0.05)
                        signals.check()  # (a signal interrupts that wait)
                        self.turn(msg)
                    self.procs.close(10.0)  # every member said done: let them exit
                finally:  # (WorkerFailed carries `agents.pids`: complete once this read the last reports)
                    self.procs.close(0.0)
                    self.records.close()
                    self.transport.close()
                    self.store = None  # shut the TCPStore down with its last reference
        except (WorkerFailed, Interrupted) as stop:
            stop.advice = advice(self.job, self.log.events, failed=isinstance(stop, WorkerFailed))
            self.log.stop(stop, self.it, self.gen)
            stop.output = self.output()
            raise
        return self.output()

    def turn(self, msg) -> None:
        """One turn of the loop after its wait for a message (`msg`, or None): liveness verdicts,
        deaths, the abort grace, the join barrier; `msg` is handled; then the open failure is
        replanned if that made it quiescent (the last `Abort` in: no wait for the next turn)."""
        self.procs.check_alive(self.members)
        dead = self.procs.dead(self.members)
        if dead and not self.finished:
            self.lose(dead)
        elif dead:
            self.procs.fail({})
        stray = self.fails.unexplained()
        if stray:
            self.procs.fail(stray)
        self.release()
        if msg is not None:
            self.procs.dispatch(msg)
        if self.fails.open is not None and self.fails.quiescent(self.members, self.plans, self.joined_devs):
            self.recover()

    def output(self) -> dict:
        """What `launch_elastic` returns (also what a stopped job had: `WorkerFailed.output`)."""
        mark_noticed(self.log.events, self.fails.noticed)
        state = self.job.return_state and self.finished and self.procs.done >= self.members
        return {
            "state": gather_replicas(self.cur, self.shards) if state else {},
            "events": self.log.events,
            "plans": self.plans,
            "pids": self.procs.agents.pids,
            "faults": self.timed.injected,
        }

    def context(self):
        """What the policy plans for (`reconfig.planning_context`): generation 0's plan and workload, on
        this run's nodes, of the hardware the watch calibrated (the `cpu` preset until then)."""
        hardware = None if self.watch is None else self.watch.hardware
        return planning_context(self.plan, self.job.workload, self.devices_per_node, hardware)

    def publish(self, new: Plan, start: int, reason: str = "planned", source=None, restore=None) -> None:
        """Generation g+1 (the controller alone numbers plans); `source`: (generation, plan) whose
        held state the members transfer from; `restore`: else a checkpoint they load."""
        self.gen, self.cur = self.gen + 1, new.with_changes(generation=self.gen + 1)
        gen, cur, faults = self.gen, self.cur, tuple(self.timed.faults)
        self.plans.append(cur)
        body = Generation(gen, cur, tuple(sorted(self.members)), start, source, faults, restore)
        self.bodies[gen] = body
        self.barrier.open(gen, self.members)
        self.board.publish(body, gen)
        self.log.emit(
            {"iter": start, "kind": "replan", "generation": gen, "devices": cur.devices(), "reason": reason}
        )

    def spawn(self, dev: int, body: Generation) -> None:
        self.procs.spawn(dev, MemberArgs(body, self.job, dev, self.store.port, self.transport.host).encode())
        for got in self.joined_devs.values():  # a fresh process holds nothing of earlier generations
            got.discard(dev)
        self.barrier.seen.discard(dev)  # and has reached no barrier yet

    def lose(self, dead: list[int]) -> None:
        """Members died: fail-stops of the failure not replanned yet (`Failover.lose`)."""
        if self.fails.lose(self.gen, self.it, dead):
            self.reached = {}
        self.members -= set(dead)
        for d in dead:
            self.procs.liveness.forget(d)
            cause = self.procs.cause(d)
            if cause == "abort-hung" and self.it + 1 < self.end:  # a fresh member re-joins
                self.due.add_rejoin(FaultSpec("rejoin", at_iter=self.it + 1, device=d))
            self.log.emit(
                {"iter": self.it, "kind": "fail-stop", "devices": [d], "cause": cause, "generation": self.gen}
            )

    def recover(self) -> None:
        """The failure is quiescent: publish generation g+1 over the survivors (`recovery.plan_after_stop`;
        from a checkpoint, `restart.py`); the recovery measurement starts (or goes on)."""
        t0 = time.perf_counter()
        new, reason, source, start = plan_after_stop(
            self.context(), self.plans, self.joined_devs, self.members, self.fails.open.dead, self.it,
            self.job, self.policy, self.log.emit, self.procs.agents.pids, self.fails.snapped,
        )  # fmt: skip
        plan_s = time.perf_counter() - t0
        rewind(self, start)  # (earlier: a checkpoint's, or a rollback to the last complete snapshots)
        restore = source.path if isinstance(source, Restart) else None  # (no live copy left)
        self.publish(new, self.it, reason, None if restore else source, restore)
        self.fails.replanned(self.procs.stopping, plan_s, self.gen)

    def release(self) -> None:
        """Write `go/{gen}` once every member of gen is at its rendezvous, alive; the first `go`
        starts the fault clock."""
        gen, exitcode = self.gen, self.procs.agents.exitcode
        if (
            not self.finished
            and self.barrier.ready(gen)
            and all(exitcode(d) is None for d in self.barrier.expected[gen])
        ):
            self.board.gate(gen, Gate.GO)  # every member of gen is at its rendezvous, alive
            self.barrier.decide(gen, Gate.GO)
            self.origin = time.monotonic() if self.origin is None else self.origin

    def commit(self) -> None:
        """Every plan device of `gen` reached `it`: resolve the time-keyed faults that are due, switch
        to the plan due at `it` + 1 (`Boundaries`; re-joining devices grow it back), write the
        decision, report the commit."""
        it, gen, cur = self.it, self.gen, self.cur
        elapsed = time.monotonic() - self.origin
        resolved = self.timed.resolve(it, elapsed)
        if it + 1 < self.end:
            self.log.inject(self.timed, it + 1)
        for f in resolved:
            if isinstance(f, FaultEnd):
                self.log.emit(end_event(f, elapsed - self.timed.started[f.fault]))
            elif f.kind == "rejoin":
                self.due.add_rejoin(f)
        nxt, reason, joiners = self.due.at(it + 1, gen, self.members)
        if joiners:  # fresh processes for re-joining devices; the plan grows back
            self.members |= set(joiners)
            nxt = grow_plan(self.plan, nxt or cur, self.members)
            self.log.emit({"iter": it + 1, "kind": "rejoin", "devices": joiners})
        if nxt is not None:
            self.publish(nxt, it + 1, reason, (gen, cur))
            for d in joiners:
                self.spawn(d, self.bodies[self.gen])
        verdict = Verdict.COMMIT if nxt is None else Verdict.NEXT  # of generation `gen`, still
        news = tuple(self.timed.faults) if resolved else None  # the members take them before they go on
        self.board.decide(gen, it, Decision(verdict, news))
        if self.on_commit is not None:
            self.on_commit(it, cur, [self.reached[d] for d in sorted(self.reached)])
        recovered = self.fails.committed(self.log.events, self.joined)
        if recovered is not None:
            self.log.completed(recovered)
        self.reached, self.it = {}, it + 1
        self.records.settle(it)  # every record of it - 1 that will come came before these `Reached`
        if self.it == self.end:
            self.finished = True
            self.board.publish(None, self.gen + 1)  # standby members: stop

    def handlers(self) -> dict:
        """The member half of the dispatch table (`Processes.dispatch` adds the agents')."""
        return {kind: getattr(self, f"on_{kind.name.lower()}") for kind in FROM_MEMBER}

    def on_error(self, msg: Error) -> None:
        self.procs.fail({msg.device: msg.traceback})

    def on_stopping(self, msg: Stopping) -> None:
        self.procs.stopping[msg.device] = msg.time

    def on_joining(self, msg: Joining) -> None:
        self.barrier.arrive(msg.generation, msg.device)

    def on_abort(self, msg: Abort) -> None:
        self.fails.abort(msg.generation, msg.device, msg.error, self.gen, msg.snapshot)

    def on_joined(self, msg: Joined) -> None:
        g = msg.generation
        self.joined_devs.setdefault(g, set()).add(msg.device)
        got = self.joined.setdefault(g, [])
        got.append(msg)
        if len(got) == len(self.barrier.expected[g]) and g > 0:
            self.log.emit(transfer_event(self.it, g, got))

    def on_reached(self, msg: Reached) -> None:
        self.fails.snapped.certify(msg.generation, msg.device, msg.iter)  # (its `iter` snapshots: complete)
        if msg.generation == self.gen and self.fails.open is None:  # (a failure: `it` is aborted already)
            self.reached[msg.device] = msg
            if set(self.reached) == set(self.cur.devices()):
                self.commit()

    def on_record(self, msg: Record) -> None:
        """A plan device's trace record (to `records`). With `detect_slow`, each complete iteration goes
        to the `SlowWatch`; its new reports in the current generation go to the scheduler
        (`reconfig.replan_after_slow`), whose plan is due from `it` + 1 (`Boundaries.propose`)."""
        g_rec, watch = msg.generation, self.watch
        got = self.records.add(msg.device, msg.iter, msg.line, len(self.plans[g_rec].devices()))
        if watch is None or got is None:
            return
        found = watch.observe(msg.iter, g_rec, [decode_record(line) for line in got])
        found = watch.admit(g_rec, found) if g_rec == self.gen else []
        if found:  # the scheduler decides (reconfig.replan_after_slow), from it + 1
            known = (watch.speeds, watch.link_factors)
            new, reason = replan_after_slow(
                self.context(), self.cur, self.members, self.policy, *known, found, watch.before
            )
            reason = self.due.propose(self.it + 1, new, reason, self.gen)
            for r in found:
                self.log.emit(slow_event(r, reason))

    def on_saved(self, msg: Saved) -> None:
        """A checkpoint is complete once every saver of its plan wrote."""
        got, wrote = self.saved.setdefault((msg.generation, msg.iter), set()), self.plans[msg.generation]
        got.add(msg.device)
        if got == set(savers(wrote)):
            path = write_meta(self.job.checkpoint_dir, msg.iter, wrote, self.job, self.job.keep_checkpoints)
            self.log.emit({"iter": msg.iter, "kind": "checkpoint", "path": path})

    def on_state(self, msg: State) -> None:
        self.shards[msg.device] = msg.shards

    def on_done(self, msg: Done) -> None:
        self.procs.finish(msg.device)
