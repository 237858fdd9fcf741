"""Controller of the elastic runtime: commits iterations, publishes Plan generations, survives stops.

The controller (the calling process) hosts the `TCPStore` and reads the members' messages; one agent
process per node (`agent.py`) spawns, watches, kills and reaps that node's member processes
(`member.py`) on its commands and reports their exits and heartbeats.

* Commit: iteration k of generation g is committed when every plan device of g reported `Reached`
  at its STEP; the controller then writes `decision/{g}/{k}` = `Verdict.COMMIT` (or `NEXT` when a
  planned replan starts at k + 1, after publishing `plan/{g+1}`). The committed history holds each
  iteration exactly once, with the losses of the generation that committed it.
* Time-keyed faults (`faults.TimedFaults`): the controller's clock starts when it first writes
  `go` (every member of the first generation is at its rendezvous: process start-up is excluded).
  At the commit of k, time-keyed faults that are due become faults of iteration k + 1 and
  `duration_s` faults that are over end at k + 1; the decision then carries every fault resolved
  so far (`Decision.faults`). Every generation's body (`protocol.Generation`) carries them too.
* Liveness (`processes.py`): a member silent for `heartbeat_timeout_s` is killed, a node whose
  agent died or went silent is fenced; either way its devices become fail-stops.
* Fail-stop: a member process that exited is a `fail-stop` of its device. The controller asks the
  scheduler policy for generation g+1 over the survivors (`recovery.py`: `reconfig.replan_after_stop`,
  falling back to `shrink_plan`), publishes it, then writes `ABORT` for the iteration in flight:
  survivors skip its step, join g+1, receive lost shards from a DP peer and re-run it. A member
  that reports a failed collective while no process died, or a member error, ends the job with
  `WorkerFailed` (every child reaped).
* Join barrier: members of generation g start its gloo rendezvous only once the controller wrote
  `go/{g}` (every member arrived, alive). A death before that supersedes g (`Gate.ABORT`); a death
  after it fails the survivors' join (gloo raises, or the short join timeout). Either way the
  next generation is replanned from, and transfers from, the last generation every survivor
  joined (`recovery.source_generation`) — a rebuild that failed ran nothing and committed nothing.

Every message is handled by one method `on_<kind>` through the one dispatch table
(`Processes.dispatch`, `protocol.Dispatch`): a kind without a handler raises.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch.distributed as dist

from resihp.core.faults import FaultSpec
from resihp.core.plan import Plan
from resihp.sched.base import Policy
from resihp.sched.ours import ResiHP

from ..adapt.reconfig import grow_plan, planning_context, replan_after_slow
from ..adapt.recovery import close_recovery, mark_noticed, plan_after_stop
from ..adapt.slowwatch import slow_event, watch_job
from ..faults import FaultEnd, TimedFaults, end_event
from ..job import JobSpec
from ..state.checkpoint import savers, write_meta
from ..state.transfer import gather_replicas
from .abort import ABORT_HUNG_EXIT
from .board import Board
from .boundaries import Boundaries
from .liveness import HEARTBEAT_TIMEOUT_S, START_TIMEOUT_S, JoinBarrier, Liveness
from .processes import Processes
from .protocol import (
    Abort,
    Decision,
    Done,
    Error,
    Gate,
    Generation,
    Joined,
    Joining,
    Kind,
    MemberArgs,
    Reached,
    Record,
    Saved,
    State,
    Stopping,
    Verdict,
)
from .transport import Transport

ABORT_GRACE_S = 5.0  # a reported collective failure with no dead process after this -> WorkerFailed
DEFAULT_POLICY = ResiHP()  # policies are pure: one instance serves every run


def launch_elastic(
    plan: Plan,
    job: JobSpec,
    *,
    faults=(),
    replans: list[tuple[int, Plan]] | tuple = (),
    on_commit: Callable[[int, Plan, list[Reached]], None] | None = None,
    detect_slow: bool = False,
    policy: Policy | None = DEFAULT_POLICY,
    heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S,
    start_timeout_s: float = START_TIMEOUT_S,
    devices_per_node: int | None = None,
) -> dict:
    """Run `job` from `plan` (generation 0), switching to each `(iteration, plan)` of `replans` at
    that iteration boundary and recovering from member deaths; returns records, state and events.

    `on_commit(it, plan, reached)` is called once per committed iteration with each plan device's
    `Reached` message (`losses`, `wall_s`; device order). The result: {"records": {it: [trace
    records]}, "state": replica -> full state dict of the final plan (with `job.return_state`),
    "events", "plans", "pids": every agent and member process}. With `detect_slow`, committed
    iterations' compute
    (and, with `job.link_mb_per_s`, P2P transfer) timings go to `SlowWatch`; its new `fail-slow` /
    `link-slow` reports go to the scheduler `policy` (a `resihp.sched.Policy`;
    `reconfig.replan_after_slow`; None or no usable plan: the `rebalance_slow` rule), whose plan
    runs from the next iteration boundary on.
    After a fail-stop, generation g+1 comes from the `policy` too (`reconfig.replan_after_stop`;
    None: the `shrink_plan` rule).
    A member silent for `heartbeat_timeout_s` is killed (then a fail-stop); one with no heartbeat
    `start_timeout_s` after its spawn fails the job. Devices `d` with the same `d // devices_per_node`
    (None: all) form a node with one agent; a node whose agent dies or goes silent loses them all.
    `faults` (checked by `core.faults.check_faults`) may be time-keyed (resolved at commits:
    `TimedFaults`); the result's "faults" lists (fault as given, iteration it took effect at,
    seconds on the clock) of each time-keyed one that was resolved.
    """
    return Controller(
        plan, job, faults=faults, replans=replans, on_commit=on_commit, detect_slow=detect_slow,
        policy=policy, heartbeat_timeout_s=heartbeat_timeout_s, start_timeout_s=start_timeout_s,
        devices_per_node=devices_per_node,
    ).run()  # fmt: skip


class Controller:
    """One run of `launch_elastic`: the controller's state, and one method `on_<kind>` per kind of
    member message (`handlers`, the member half of the dispatch table).

    `gen`, `cur`: the latest published generation and its plan; `it`: the iteration to commit next;
    `members`: the devices of the live member processes; `reached`: plan device -> its `Reached`
    message for `it` in `gen`; `plans`, `bodies`: every generation's plan and published body.
    """

    def __init__(
        self,
        plan: Plan,
        job: JobSpec,
        *,
        faults,
        replans,
        on_commit: Callable[[int, Plan, list[Reached]], None] | None,
        detect_slow: bool,
        policy: Policy | None,
        heartbeat_timeout_s: float,
        start_timeout_s: float,
        devices_per_node: int | None,
    ) -> None:
        self.plan, self.job, self.on_commit, self.policy = plan, job, on_commit, policy
        self.devices_per_node = devices_per_node
        self.end = job.start_iteration + job.iterations
        self.timed = TimedFaults(faults, job.start_iteration, self.end)
        self.due = Boundaries(replans, self.timed.faults, self.end)
        self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        self.board = Board(self.store)
        transport = Transport()
        self.results = transport.channel()
        self.gen, self.cur, self.it = 0, plan, job.start_iteration
        self.members = set(plan.devices()) | set(plan.standby)
        body0 = Generation(0, plan, tuple(sorted(self.members)), self.it, None, tuple(self.timed.faults))
        self.origin = None  # the fault clock: time.monotonic() when the first `go` was written
        self.records, self.shards, self.events, self.plans = {}, {}, [], [plan]
        self.reached: dict[int, Reached] = {}
        self.joined: dict[int, list[Joined]] = {}  # generation -> its members' `Joined` messages
        self.recovery: dict | None = None  # the fail-stop not recovered yet (`recovery.close_recovery`)
        self.abort_since = None
        self.finished = False  # the last iteration is committed
        self.watch = watch_job(self.plans, job) if detect_slow and job.timing else None
        self.saved: dict[int, set[int]] = {}  # checkpoint iteration -> devices that wrote their shards
        liveness = Liveness(heartbeat_timeout_s, start_timeout_s)
        self.procs = Processes(
            transport, self.results, liveness, devices_per_node, heartbeat_timeout_s, start_timeout_s,
            self.handlers(),
        )  # fmt: skip
        self.barrier = JoinBarrier()
        self.barrier.open(0, self.members)
        self.joined_devs: dict[int, set[int]] = {}  # generation -> members that completed its join
        self.bodies: dict[int, Generation] = {0: body0}
        self.aborts: dict[int, str] = {}  # device -> its failed collective, in the current generation
        self.noticed: dict[int, dict[int, str]] = {}  # generation -> device -> how it saw the failure

    def run(self) -> dict:
        """Spawn generation 0's members, then handle deaths, the join barrier and every message until
        the last iteration is committed and every member said done."""
        try:
            for dev in sorted(self.members):
                self.spawn(dev, self.bodies[0])
            while not (self.finished and self.procs.done >= self.members):
                msg = self.procs.inbox.get(0.05)
                self.procs.check_alive(self.members)
                dead = self.procs.dead(self.members)
                if dead and not self.finished:
                    self.recover()
                elif dead:
                    self.procs.fail({})
                if self.abort_since is not None and time.monotonic() - self.abort_since > ABORT_GRACE_S:
                    why = "reported a failed collective, no process died"
                    self.procs.fail({d: f"{why}: {e}" for d, e in self.aborts.items()})
                self.release()
                if msg is not None:
                    self.procs.dispatch(msg)
            self.procs.close(10.0)  # every member said done: let them exit
        finally:  # (a WorkerFailed carries `agents.pids`: complete once this close read the last reports)
            self.procs.close(0.0)
            self.results.close()
            self.store = None  # shut the TCPStore down with its last reference
        mark_noticed(self.events, self.noticed)
        return {
            "records": {k: [v[d] for d in sorted(v)] for k, v in sorted(self.records.items())},
            "state": gather_replicas(self.cur, self.shards) if self.job.return_state else {},
            "events": self.events,
            "plans": self.plans,
            "pids": self.procs.agents.pids,
            "faults": self.timed.injected,
        }

    def context(self):
        """What the policy plans for: generation 0's plan and the workload on this run's node layout,
        of the hardware the watch calibrated (the `cpu` preset until then), `reconfig.planning_context`."""
        hardware = None if self.watch is None else self.watch.hardware
        return planning_context(self.plan, self.job.workload, self.devices_per_node, hardware)

    def publish(self, new: Plan, start: int, reason: str = "planned", source: tuple | None = None) -> None:
        """Generation g+1 (the controller alone numbers plans); `source`: (generation, plan) whose
        held state the members transfer from."""
        self.gen, self.cur = self.gen + 1, new.with_changes(generation=self.gen + 1)
        gen, cur = self.gen, self.cur
        self.plans.append(cur)
        body = Generation(gen, cur, tuple(sorted(self.members)), start, source, tuple(self.timed.faults))
        self.bodies[gen] = body
        self.barrier.open(gen, self.members)
        self.board.publish(body, gen)
        self.events.append(
            {"iter": start, "kind": "replan", "generation": gen, "devices": cur.devices(), "reason": reason}
        )

    def spawn(self, dev: int, body: Generation) -> None:
        self.procs.spawn(dev, MemberArgs(body, self.job, dev, self.store.port).encode())
        for got in self.joined_devs.values():  # a fresh process holds nothing of earlier generations
            got.discard(dev)

    def recover(self) -> None:
        """A member died: publish generation g+1 over the survivors (`recovery.plan_after_stop`), then
        write `Gate.ABORT` for every generation still before its rendezvous and `Verdict.ABORT` for
        the iteration in flight; the recovery measurement starts (or goes on, from a failure not
        recovered yet)."""
        t_detect = time.time()
        time.sleep(0.1)  # collect the other deaths of one event (two devices stopped at once)
        self.procs.inbox.drain()
        dead = self.procs.dead(self.members)
        self.members -= set(dead)
        for d in dead:
            self.procs.liveness.forget(d)
            cause = self.procs.killed.get(d, "exit")
            if self.procs.agents.exitcode(d) == ABORT_HUNG_EXIT and self.it + 1 < self.end:
                cause = "abort-hung"  # its NCCL abort hung (abort.py): a fresh member re-joins
                self.due.add_rejoin(FaultSpec("rejoin", at_iter=self.it + 1, device=d))
            self.events.append(
                {"iter": self.it, "kind": "fail-stop", "devices": [d], "cause": cause, "generation": self.gen}
            )
        t0 = time.perf_counter()
        new, reason, source = plan_after_stop(
            self.context(), self.plans, self.joined_devs, self.members, dead, self.it, self.job, self.policy,
            self.events, self.procs.agents.pids,
        )  # fmt: skip
        plan_s = time.perf_counter() - t0
        self.publish(new, self.it, reason, source)
        for g_old in self.barrier.supersede(self.gen):  # generations still before their rendezvous
            self.board.gate(g_old, Gate.ABORT)
        self.board.decide(self.gen - 1, self.it, Decision(Verdict.ABORT))
        self.reached, self.abort_since, self.aborts = {}, None, {}
        t_stop = min((self.procs.stopping.get(d, t_detect) for d in dead), default=t_detect)
        first = t_stop if self.recovery is None else min(t_stop, self.recovery["t_stop"])  # not recovered yet
        self.recovery = {"t_stop": first, "detect_s": t_detect - t_stop, "plan_s": plan_s, "gen": self.gen}

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
        for f in resolved:
            if isinstance(f, FaultEnd):
                self.events.append(end_event(f, elapsed - self.timed.started[f.fault]))
            elif f.kind == "rejoin":
                self.due.add_rejoin(f)
        nxt, reason, joiners = self.due.at(it + 1, gen, self.members)
        if joiners:  # fresh processes for re-joining devices; the plan grows back
            self.members |= set(joiners)
            nxt = grow_plan(self.plan, nxt or cur, self.members)
            self.events.append({"iter": it + 1, "kind": "rejoin", "devices": joiners})
        if nxt is not None:
            self.publish(nxt, it + 1, reason, (gen, cur))
            for d in joiners:
                self.spawn(d, self.bodies[self.gen])
        verdict = Verdict.COMMIT if nxt is None else Verdict.NEXT  # of generation `gen`, still
        news = tuple(self.timed.faults) if resolved else None  # the members take them before they go on
        self.board.decide(gen, it, Decision(verdict, news))
        if self.on_commit is not None:
            self.on_commit(it, cur, [self.reached[d] for d in sorted(self.reached)])
        if self.recovery is not None:
            close_recovery(self.recovery, self.events, self.joined)
            self.recovery = None
        self.reached, self.it = {}, it + 1
        if self.it == self.end:
            self.finished = True
            self.board.publish(None, self.gen + 1)  # standby members: stop

    def handlers(self) -> dict:
        """The member half of the dispatch table (`Processes.dispatch` adds the agents' reports)."""
        return {
            Kind.JOINING: self.on_joining,
            Kind.JOINED: self.on_joined,
            Kind.REACHED: self.on_reached,
            Kind.RECORD: self.on_record,
            Kind.ABORT: self.on_abort,
            Kind.ERROR: self.on_error,
            Kind.STOPPING: self.on_stopping,
            Kind.SAVED: self.on_saved,
            Kind.STATE: self.on_state,
            Kind.DONE: self.on_done,
        }

    def on_error(self, msg: Error) -> None:
        self.procs.fail({msg.device: msg.traceback})

    def on_stopping(self, msg: Stopping) -> None:
        self.procs.stopping[msg.device] = msg.time

    def on_joining(self, msg: Joining) -> None:
        self.barrier.arrive(msg.generation, msg.device)

    def on_abort(self, msg: Abort) -> None:
        self.noticed.setdefault(msg.generation, {})[msg.device] = msg.error[:200]
        if msg.generation == self.gen:
            self.aborts[msg.device] = msg.error
            self.abort_since = self.abort_since or time.monotonic()

    def on_joined(self, msg: Joined) -> None:
        g = msg.generation
        self.joined_devs.setdefault(g, set()).add(msg.device)
        got = self.joined.setdefault(g, [])
        got.append(msg)
        if len(got) == len(self.barrier.expected[g]) and g > 0:
            times = {"group_s": max(m.group_s for m in got), "transfer_s": max(m.transfer_s for m in got)}
            self.events.append({"iter": self.it, "kind": "state-transfer", "generation": g, **times})

    def on_reached(self, msg: Reached) -> None:
        if msg.generation == self.gen:
            self.reached[msg.device] = msg
            if set(self.reached) == set(self.cur.devices()):
                self.commit()

    def on_record(self, msg: Record) -> None:
        """A plan device's trace record. With `detect_slow`, each complete iteration goes to the
        `SlowWatch`; its new reports in the current generation go to the scheduler
        (`reconfig.replan_after_slow`), whose plan is due from `it` + 1 (`Boundaries.propose`)."""
        rec = msg.record
        got = self.records.setdefault(rec["iter"], {})
        got[msg.device] = rec
        g_rec, watch = rec["generation"], self.watch
        if watch is None or len(got) != len(self.plans[g_rec].devices()):
            return
        found = watch.observe(rec["iter"], g_rec, [got[d] for d in sorted(got)])
        found = watch.admit(g_rec, found) if g_rec == self.gen else []
        if found:  # the scheduler decides (reconfig.replan_after_slow), from it + 1
            known = (watch.speeds, watch.link_factors)
            new, reason = replan_after_slow(
                self.context(), self.cur, self.members, self.policy, *known, found
            )
            reason = self.due.propose(self.it + 1, new, reason, self.gen)
            self.events.extend(slow_event(r, reason) for r in found)

    def on_saved(self, msg: Saved) -> None:
        """A checkpoint is complete once every saver of its plan wrote."""
        got = self.saved.setdefault(msg.iter, set())
        got.add(msg.device)
        wrote = self.plans[msg.generation]
        if got == set(savers(wrote)):
            path = write_meta(self.job.checkpoint_dir, msg.iter, wrote)
            self.events.append({"iter": msg.iter, "kind": "checkpoint", "path": path})

    def on_state(self, msg: State) -> None:
        self.shards[msg.device] = msg.shards

    def on_done(self, msg: Done) -> None:
        self.procs.finish(msg.device)
