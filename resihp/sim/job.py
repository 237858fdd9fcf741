"""A job over wall-clock time: faults hit the true cluster, a policy reacts to what it detects.

Between events the job runs at `global micro-batches / iteration time` of the current plan on the
true cluster (pipeline DAG via `resihp.evaluator.predict`, averaged over sampled packed batches; see
`timing.PlanTimer`); 0 while paused, while the plan uses a dead device (the job hangs until the
policy replans) and after an abort. Semantics:

- each fault reaches the policy as a FailureReport after its detector's latency (`detection`);
  reports due at the same time go to one `adapt` call, fail-stops first;
- a Decision pauses training for `reconfig.pause_s` plus the fail-slow validation pause plus
  `reconfig.lost_work_s` (lost work is redone, i.e. costs its length again);
- false alarms arrive as a seeded Poisson count uniformly over the run, each a pause;
- policies plan for the scenario's `PlanningContext` (its uniform plan, workload and cluster);
- a policy whose `escalations(ctx, plan, view)` gives rungs (Greyhound's ladder) climbs one rung
  by ski rental: once the throughput lost by not escalating equals what the rung's pause costs;
- runs given in iterations last `iterations · t0` seconds (t0 = the uniform plan's iteration time);
- the capacity bound is X0 · Σ live speed / N, X0 = `fault_free_samples_per_s`: the best healthy
  plan any built planner finds (the uniform plan or `resihp`'s own healthy plan, with or without
  the CPU-path option), so no policy can beat it by finding a better layout than the uniform one;
- `lost` accounts for the gap between the bound and the achieved samples by cause, interval by
  interval (`account.LossAccount`; also per event).

Same scenario, policy and seed give byte-identical `to_dict()` JSON.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field, replace

from resihp.core.report import FailureReport
from resihp.core.scenario import Scenario
from resihp.sched.context import PlanningContext
from resihp.sched.registry import POLICIES, check_name

from .account import LossAccount
from .faultgen import generate
from .timing import PlanTimer
from .trace import TraceEvent, build_trace


@dataclass
class PolicyRun:
    policy: str
    samples_per_s: float
    capacity_bound_samples_per_s: float
    aborted: bool
    abort_t_s: float | None
    events: list[dict] = field(default_factory=list)
    timeline: list[list[float]] = field(default_factory=list)
    account: dict = field(default_factory=dict)  # account.LossAccount.close(): lost by cause

    def to_dict(self) -> dict:
        return {
            "samples_per_s": round(self.samples_per_s, 6),
            "capacity_bound_samples_per_s": round(self.capacity_bound_samples_per_s, 6),
            "aborted": self.aborted,
            "abort_t_s": None if self.abort_t_s is None else round(self.abort_t_s, 3),
            "events": self.events,
            "timeline": [[round(t, 3), round(x, 6)] for t, x in self.timeline],
            "lost": {c: round(v, 6) for c, v in self.account.get("lost", {}).items()},
            "lost_initial_plan": round(self.account.get("lost_initial_plan", 0.0), 6),
            "above_bound": round(self.account.get("above_bound", 0.0), 6),
        }


def horizon_s(scenario: Scenario, t0: float) -> float:
    return float(scenario.duration_s) if scenario.duration_s is not None else scenario.iterations * t0


def fault_free_samples_per_s(job, timer: PlanTimer) -> float:
    """X0 of the capacity bound (architecture §5.2): the fastest healthy plan any built planner
    finds: the job's uniform plan or `resihp`'s plan for the whole cluster (reconfiguration cost
    ignored), timed with and without the CPU-path cost option. Cached on the timer."""
    x0 = getattr(timer, "fault_free_samples_per_s", None)
    if x0 is None:
        from resihp.sched.ours import ResiHP

        plans = [job.initial_plan()]
        try:
            ctx = PlanningContext.of_job(job)
            plans.append(ResiHP(horizon_s=math.inf).choose_plan(ctx, plans[0], job.cluster)[1])
        except ValueError:
            pass
        x0 = max(
            timer.samples_per_s(p, job.cluster, opts) for p in plans for opts in ({}, {"send_blocks": False})
        )
        timer.fault_free_samples_per_s = x0
    return x0


def scenario_faults(scenario: Scenario, timer: PlanTimer, seed: int, t0: float):
    if scenario.generator:
        return generate(scenario.job, scenario.generator, horizon_s(scenario, t0), timer, seed)
    return scenario.faults


def _view(cluster, r: FailureReport):
    if r.kind == "fail-stop":
        return cluster.with_alive(r.devices[0], False)
    if r.kind == "rejoin":
        return cluster.with_alive(r.devices[0], True)
    if r.kind in ("fail-slow", "recovered") and r.link is None:
        return cluster.with_speed(r.devices[0], r.severity) if cluster.alive[r.devices[0]] else cluster
    return cluster.with_link(*r.link, r.severity)


_ORDER = {"fail-stop": 0, "rejoin": 1, "fail-slow": 2, "link-slow": 3, "recovered": 4}


class _Run:
    def __init__(self, scenario: Scenario, policy, seed: int, timer: PlanTimer, faults):
        self.job = job = scenario.job
        self.ctx = PlanningContext.of_job(job)
        self.policy = policy
        self.timer = timer
        self.det = policy.detector(self.ctx)
        self.plan = policy.initial_plan(self.ctx, job.cluster)
        self.t0 = timer.iteration_s(job.initial_plan(), job.cluster)
        self.x0 = fault_free_samples_per_s(job, timer)
        self.horizon = horizon_s(scenario, self.t0)
        self.true = self.view = job.cluster
        self.queue: list = []
        self.seq = 0
        self.pause_until = 0.0
        self.version = 0  # bumped by every replan: stale escalations are dropped
        self.aborted, self.abort_t = False, None
        self.events: list[dict] = []
        self.timeline: list[list[float]] = []
        self.samples = self.cap = 0.0
        self.pending: dict = {}  # fault key -> seq of its not yet delivered detection
        self.account = LossAccount(getattr(policy, "planning_s", 0.0))
        for ev in build_trace(faults, job.cluster, self.t0):
            self.push(ev.t_s, "fault", ev)
        rng = random.Random(f"false-alarms:{seed}:{policy.name}")
        for _ in range(_poisson(rng, self.det.false_alarms)):
            self.push(rng.uniform(0.0, self.horizon), "false-alarm", None)

    def push(self, t: float, kind: str, payload) -> int:
        self.seq += 1
        heapq.heappush(self.queue, (t, self.seq, kind, payload))
        return self.seq

    def rate(self) -> float:
        if self.aborted:
            return 0.0
        return self.timer.samples_per_s(self.plan, self.true, self.options())

    def options(self) -> dict:
        return self.policy.cost_options(self.view)

    def advance(self, t_end: float, t: float) -> float:
        """Integrate samples and the capacity bound from t to t_end; return t_end."""
        if t_end <= t:
            return t
        cap_rate = self.x0 * self.true.capacity() / self.true.num_devices
        self.cap += cap_rate * (t_end - t)
        x = self.rate()
        cut = min(max(self.pause_until, t), t_end)
        self.account.advance(self, t, cut, t_end, cap_rate, x)
        self._mark(t, 0.0 if cut > t else x)
        if cut > t:
            self._mark(cut, x)
        self.samples += x * (t_end - cut)
        return t_end

    def _mark(self, t: float, x: float) -> None:
        if not self.timeline or self.timeline[-1][1] != x:
            self.timeline.append([t, x])

    def on_fault(self, t: float, ev: TraceEvent) -> None:
        self.true = ev.apply(self.true)
        self.events.append(ev.to_dict())
        self.account.fault(self.events[-1], ev)
        det = self.det
        if self.aborted:
            return
        key = ev.link if ev.link is not None else ev.device
        if ev.kind in ("stop", "rejoin"):
            if ev.kind == "stop" and key in self.pending:
                self._cancel(key)
            if det.stop_s is not None:
                self.push(t + det.stop_s, "detect", ev.report())
            return
        iters = det.slow_iters if ev.kind.startswith("slow") else det.link_iters
        if ev.kind.endswith("-end") and key in self.pending:
            self._cancel(key)  # over before it was confirmed: nothing to report
            return
        if iters is None:
            return
        x = self.rate()
        it_s = self.plan.global_microbatches / x if x > 0 else self.t0
        seq = self.push(t + det.extra_s + iters * it_s, "detect", ev.report())
        if not ev.kind.endswith("-end"):
            self.pending[key] = seq

    def _cancel(self, key) -> None:
        seq = self.pending.pop(key)
        self.queue = [q for q in self.queue if q[1] != seq]
        heapq.heapify(self.queue)

    def on_reports(self, t: float, reports: list[FailureReport]) -> None:
        reports.sort(key=lambda r: _ORDER[r.kind])
        for r in reports:
            self.view = _view(self.view, r)
            self.pending.pop(r.link if r.link is not None else r.devices[0], None)
        decision = self.policy.adapt(self.ctx, self.plan, self.view, reports)
        slow = any(r.kind in ("fail-slow", "link-slow") for r in reports)
        self._apply(t, decision, "replan", reports, self.det.validation_pause_s if slow else 0.0)

    def _apply(self, t, decision, kind, reports, extra_pause=0.0) -> None:
        event = {"t_s": round(t, 3), "kind": kind, "reports": [r.to_dict() for r in reports]}
        if decision.aborted:
            self.aborted, self.abort_t = True, t
            event.update(kind="abort", reason=decision.reason)
            self.events.append(event)
            self.account.decision(event, plan_changed=True)
            return
        pause = decision.reconfig.pause_s + decision.reconfig.lost_work_s + extra_pause
        start = max(self.pause_until, t)
        self.pause_until = start + pause
        self.account.decision_pause(event, start, self.pause_until, decision.reconfig, extra_pause)
        self.account.decision(event, plan_changed=decision.plan != self.plan)
        self.plan = decision.plan
        self.version += 1
        event.update(pause_s=round(pause, 3), reason=decision.reason)
        self.events.append(event)
        self._schedule_escalation()

    def _schedule_escalation(self) -> None:
        ladder = self.policy.escalations(self.ctx, self.plan, self.view)
        if not ladder:
            return
        now = self.timer.samples_per_s(self.plan, self.view, self.options(), quick=True)
        for d in ladder:
            nxt = self.timer.samples_per_s(d.plan, self.view, self.options(), quick=True) if d.plan else 0.0
            if nxt > now * 1.001:
                cost = now * (d.reconfig.pause_s + d.reconfig.lost_work_s)
                self.push(self.pause_until + cost / (nxt - now), "escalate", (self.version, d))
                return

    def on_escalate(self, t: float, payload) -> None:
        version, decision = payload
        if version == self.version:  # nothing changed since the rung was priced
            self._apply(t, decision, "escalate", [])

    def run_until(self, at_s: float) -> None:
        """Handle every event at or before `at_s` (and before the horizon)."""
        self._drain(0.0, lambda t_ev: t_ev <= at_s and t_ev < self.horizon)

    def run(self) -> PolicyRun:
        t = self._drain(0.0, lambda t_ev: t_ev < self.horizon)
        self.advance(self.horizon, t)
        if self.aborted:
            self._mark(self.abort_t, 0.0)
        self.events.sort(key=lambda e: e["t_s"])
        return PolicyRun(
            self.policy.name, self.samples / self.horizon, self.cap / self.horizon,
            self.aborted, self.abort_t, self.events, self.timeline, self.account.close(self.cap),
        )  # fmt: skip

    def _drain(self, t: float, due) -> float:
        """Integrate and handle queued events while `due(next event time)`; the last time reached."""
        while self.queue and due(self.queue[0][0]):
            t_ev = self.queue[0][0]
            t = self.advance(t_ev, t)
            reports = []
            while self.queue and self.queue[0][0] == t_ev:
                _, _, kind, payload = heapq.heappop(self.queue)
                if kind == "fault":
                    self.on_fault(t_ev, payload)
                elif self.aborted:
                    continue  # the true cluster still changes (capacity bound); the policy is gone
                elif kind == "detect":
                    reports.append(payload)
                elif kind == "escalate":
                    self.on_escalate(t_ev, payload)
                else:
                    start = max(self.pause_until, t_ev)
                    self.pause_until = start + self.det.false_alarm_pause_s
                    self.events.append({"t_s": round(t_ev, 3), "kind": "false-alarm"})
                    self.account.pause(self.events[-1], start, self.pause_until,
                                       [("detection", self.det.false_alarm_pause_s)])  # fmt: skip
            if reports and not self.aborted:
                self.on_reports(t_ev, reports)
        return t


def _poisson(rng: random.Random, mean: float) -> int:
    """Knuth's method; fine for the small means of false alarms per job."""
    if mean <= 0:
        return 0
    limit, k, p = math.exp(-mean), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


def with_seed(scenario: Scenario, seed: int) -> Scenario:
    """The scenario with its workload seed replaced: one seed drives data, faults and alarms."""
    job = scenario.job
    return replace(scenario, job=replace(job, workload=replace(job.workload, seed=seed)))


def simulate(
    scenario: Scenario, policy, seed: int | None = None, timer: PlanTimer | None = None
) -> PolicyRun:
    """Run `policy` through `scenario` (faults generated with `seed`; default the workload seed)."""
    seed = scenario.job.workload.seed if seed is None else seed
    scenario = with_seed(scenario, seed)
    timer = timer or PlanTimer(scenario.job, seed)
    t0 = timer.iteration_s(scenario.job.initial_plan(), scenario.job.cluster)
    return _Run(scenario, policy, seed, timer, scenario_faults(scenario, timer, seed, t0)).run()


def plan_at(scenario: Scenario, policy_name: str, at_s: float, seed: int | None = None):
    """(plan, cluster) at `at_s` under `policy_name`: the plan the policy holds once every event at
    or before `at_s` is handled (faults, detections, replans, escalations), None once it aborted,
    and the true cluster then (a fault not yet detected is in the cluster, not yet in the plan).
    """
    if at_s < 0:
        raise ValueError(f"at_s = {at_s!r}: must be >= 0")
    check_name(policy_name)
    seed = scenario.job.workload.seed if seed is None else seed
    scenario = with_seed(scenario, seed)
    timer = PlanTimer(scenario.job, seed)
    t0 = timer.iteration_s(scenario.job.initial_plan(), scenario.job.cluster)
    run = _Run(scenario, POLICIES[policy_name](), seed, timer, scenario_faults(scenario, timer, seed, t0))
    run.run_until(at_s)
    return (None if run.aborted else run.plan), run.true
