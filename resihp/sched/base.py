"""The policy contract (baselines.md §0): from (planning context, current plan, cluster state,
failure reports) to a new Plan, the reconfiguration it costs, and its predicted iteration time.

Policies are pure and deterministic: no torch, no clocks, no global state. The job simulator and
the runtime's controller both call `adapt`, once per replan, with what they have: the context
(`context.PlanningContext`: the home plan, the workload, the job's devices), the plan running
now, the cluster as the detector sees it (reports already applied) and the reports.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace

from resihp.core.cluster import Cluster
from resihp.core.plan import Plan
from resihp.core.report import FailureReport

from .context import PlanningContext
from .detector import DetectorSpec, resihp_detector


@dataclass(frozen=True)
class Reconfig:
    """What changing plans costs. `transfers` = (source, dst device, bytes); source (reconfig.py)
    -1 = snapshot, -2 = a copy on dst's node, -3 = a copy on another node."""

    rebuilt_groups: tuple[tuple[int, ...], ...] = ()
    transfers: tuple[tuple[int, int, int], ...] = ()
    layers_moved: int = 0
    pause_s: float = 0.0  # planning + group rebuild + state transfer (+ restart) before training resumes
    lost_work_s: float = 0.0  # training time thrown away (checkpoint-restart)


@dataclass(frozen=True)
class Decision:
    """`weighed`: the candidates (label, plan) the policy chose among, if it says. `prompted`:
    whether the reports are why the plan changes; False only when `adapt` was given the view
    `before` the reports and on it the policy would pick this plan too (its cost model prefers
    another layout of the healthy job, say): no answer to these reports."""

    plan: Plan | None  # None: the policy aborts the job
    reconfig: Reconfig = field(default_factory=Reconfig)
    predicted_iteration_s: float = float("inf")
    reason: str = ""
    weighed: tuple[tuple[str, Plan], ...] = ()
    prompted: bool = True

    @property
    def aborted(self) -> bool:
        return self.plan is None


def same_work(a: Plan, b: Plan) -> bool:
    """The same groups, layers and micro-batches: switching between them moves nothing."""
    return (a.replicas, a.microbatches, a.assignment) == (b.replicas, b.microbatches, b.assignment)


class Policy(ABC):
    """A resilience policy. Subclasses set `name` (the registry key, `registry.POLICIES`), take
    their options as keyword arguments with defaults, implement `decide` and may override the
    hooks `initial_plan`, `detector`, `cost_options`, `escalations` and `wins`."""

    name: str = "?"

    def adapt(
        self,
        ctx: PlanningContext,
        plan: Plan,
        cluster: Cluster,
        reports: list[FailureReport],
        *,
        before: Cluster | None = None,
    ) -> Decision:
        """React to `reports` (already applied to `cluster`) with a new plan, or abort.

        With `before` (the cluster as seen before the reports), `Decision.prompted` says whether
        the reports are why the plan changes: false when on `before` the new plan `wins` over
        keeping `plan` and over every other candidate the policy weighed. One planning pass
        either way: `before` only re-prices plans the pass built."""
        decision = self.decide(ctx, plan, cluster, reports)
        new = decision.plan
        if before is None or new is None or same_work(new, plan):
            return decision
        others = [c for c in decision.weighed if not same_work(c[1], new) and not same_work(c[1], plan)]
        return replace(decision, prompted=not self.wins(ctx, plan, new, others, before))

    @abstractmethod
    def decide(
        self, ctx: PlanningContext, plan: Plan, cluster: Cluster, reports: list[FailureReport]
    ) -> Decision:
        """The policy itself: `adapt` without the `before` check."""

    def wins(
        self, ctx: PlanningContext, plan: Plan, new: Plan, others: list[tuple[str, Plan]], cluster: Cluster
    ) -> bool:
        """Whether on `cluster` this policy would switch from `plan` to `new` rather than keep `plan`
        or take any of `others` [(label, plan)] (a tie goes to the other): `new` is the fastest
        by the ITP under its `cost_options`. Stops at the first rival that ties or beats it."""
        from resihp.evaluator.predict import predict

        opts = self.cost_options(cluster)
        mine = predict(ctx, new, cluster, **opts).iteration_s
        rivals = [plan, *(p for _, p in others)]
        return all(predict(ctx, p, cluster, **opts).iteration_s > mine for p in rivals)

    def initial_plan(self, ctx: PlanningContext, cluster: Cluster) -> Plan:
        """The plan the job starts with: the home plan."""
        return ctx.home

    def detector(self, ctx: PlanningContext) -> DetectorSpec:
        """How fast this policy's detector reports faults, and what detection costs (the job
        simulator's model of it, `detector.py`); default: ResiHP's."""
        return resihp_detector(ctx)

    def cost_options(self, view: Cluster) -> dict:
        """Cost-model options the plan runs under on `view` (e.g. PP sends over the CPU path)."""
        return {}

    def escalations(self, ctx: PlanningContext, plan: Plan, view: Cluster) -> list[Decision]:
        """Rungs the job simulator may climb after a replan (Greyhound's ladder), first rung first;
        default: none."""
        return []
