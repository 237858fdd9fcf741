"""ReCycle (baselines.md §2.3): a dead stage's micro-batches rerouted evenly to its DP peers.

The whole TP group of a failed device is dropped: stage s of replica r becomes hollow and its
micro-batches run on the surviving replicas of stage s, round-robin, without regard to their load
or speed (the paper's "without regard to stage progress"); the pipeline simulator fits the extra
chunks into each peer's schedule. Aborts when every replica of some stage is dead. Re-joined
groups get their stage back (state copied from a peer). Fail-slows: no action.
"""

from __future__ import annotations

from resihp.core.plan import Plan, Stage
from resihp.sched.base import Decision, Policy
from resihp.sched.detector import DetectorSpec

from .common import PLANNING_S, dead_groups, switch, unchanged


def recycle_plan(ctx, view, microbatches) -> Plan | None:
    """The initial layout with dead groups hollow and their chunks rerouted; None if impossible."""
    plan0 = ctx.home
    dead = dead_groups(ctx, view)
    replicas = [
        tuple(Stage((), st.layers) if (d, i) in dead else st for i, st in enumerate(stages))
        for d, stages in enumerate(plan0.replicas)
    ]
    assignment = []
    for i in range(ctx.pp):
        peers = [d for d in range(plan0.dp) if (d, i) not in dead]
        hollow = [d for d in range(plan0.dp) if (d, i) in dead]
        if hollow and not peers:
            return None
        turn = 0
        for d in hollow:
            for j in range(microbatches[d]):
                assignment.append((d, j, i, peers[turn % len(peers)]))
                turn += 1
    return Plan(ctx.model, tuple(replicas), tuple(microbatches), plan0.schedule, tuple(assignment))


class ReCycle(Policy):
    """ReCycle: a dead stage's micro-batches rerouted evenly to its DP peers."""

    name = "recycle"

    def detector(self, ctx) -> DetectorSpec:
        return DetectorSpec()  # shared heartbeat fail-stop detector; no fail-slow detection

    def microbatches(self, ctx, plan, cluster) -> tuple[int, ...]:
        return plan.microbatches

    def decide(self, ctx, plan, cluster, reports) -> Decision:
        if not any(r.kind in ("fail-stop", "rejoin") for r in reports):
            return unchanged(plan)
        new = recycle_plan(ctx, cluster, self.microbatches(ctx, plan, cluster))
        if new is None:
            return Decision(None, reason="every replica of a stage is dead")
        return switch(ctx, plan, new, cluster, "reroute dead stages to DP peers", PLANNING_S)
