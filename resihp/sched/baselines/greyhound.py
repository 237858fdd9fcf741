"""Greyhound (baselines.md §2.5): detect fail-slows, then climb S2 -> S3 -> S4 by ski rental.

- Detection: 10-iteration persistence + one profiled iteration + a validation pause (Table 5),
  and Table 5's false alarms under packed data (`resihp.sched.detector.greyhound_detector`).
- S2 (on detection): the global batch re-weighted over DP replicas by each replica's measured
  throughput; no structural change.
- S3: the layers of every pipeline re-split in proportion to its stages' speeds, then S2 again;
  costs a rebuild and the layer moves.
- S4: checkpoint-restart without the slow devices (and without the senders of slow links).
- Escalation: the job simulator climbs to the next rung once the throughput lost by staying equals
  the rung's one-time cost (`escalations`). When the fault ends, back to the original plan.
- Fail-stop: S4 (heartbeat detection); the whole TP group is dropped with its node's pipeline.
"""

from __future__ import annotations

from resihp.sched.base import Decision, Policy, Reconfig
from resihp.sched.detector import greyhound_detector

from .common import (
    RESTART_S,
    link_excluded,
    next_generation,
    replica_rates,
    resplit,
    restart,
    restart_plan,
    reweight,
    switch,
    unchanged,
)


def slow_devices(view) -> set[int]:
    return {x for x in range(view.num_devices) if view.alive[x] and view.speed[x] < 1.0}


def s2(ctx, plan, view) -> Decision:
    new = reweight(ctx, plan, replica_rates(ctx, plan, view))
    return switch(ctx, plan, new, view, "S2: re-weight micro-batches per DP replica")


def s3(ctx, plan, view) -> Decision:
    split = plan.with_changes(replicas=tuple(resplit(ctx, stages, view) for stages in plan.replicas))
    new = reweight(ctx, split, replica_rates(ctx, split, view))
    return switch(ctx, plan, new, view, "S3: re-split layers inside slow pipelines")


def s4(ctx, plan, view) -> Decision:
    return restart(ctx, plan, view, slow_devices(view) | link_excluded(view), reason="S4: restart without it")


def back_to_normal(ctx, plan, view) -> Decision:
    """The fault is over: the original layout (or the best restart layout) at one reconfiguration."""
    target = restart_plan(ctx, view)
    if target is None:
        return unchanged(plan, "waiting for repair")
    if target.dp != plan.dp or target.devices() != plan.devices():
        return Decision(next_generation(plan, target), Reconfig(pause_s=RESTART_S), reason="planned restart")
    return switch(ctx, plan, target, view, "fault over: restore")


class Greyhound(Policy):
    """Greyhound: fail-slows climb S2 (re-weight) -> S3 (re-split) -> S4 (restart) by ski rental."""

    name = "greyhound"

    def detector(self, ctx):
        return greyhound_detector(ctx)

    def decide(self, ctx, plan, cluster, reports) -> Decision:
        kinds = {r.kind for r in reports}
        if any(not cluster.alive[x] for x in plan.devices()):
            return s4(ctx, plan, cluster)
        if kinds & {"fail-slow", "link-slow"}:
            return s2(ctx, plan, cluster)
        if kinds & {"recovered", "rejoin"} and not slow_devices(cluster) and not cluster.links:
            return back_to_normal(ctx, plan, cluster)
        if kinds & {"recovered"}:
            return s2(ctx, plan, cluster)
        return unchanged(plan)

    def escalations(self, ctx, plan, view) -> list[Decision]:
        if (not slow_devices(view) and not view.links) or any(not view.alive[x] for x in plan.devices()):
            return []
        return [s3(ctx, plan, view), s4(ctx, plan, view)]
