"""Strengthened ReCycle / Oobleck (baselines.md §2.7): the base system plus Greyhound's ladder.

Fail-stops go to the base policy, fail-slows to Greyhound (fail-stop first when both are pending;
S4 disabled). S-ReCycle: S2 re-weights micro-batch counts per DP replica by measured speed while
ReCycle keeps rerouting a dead stage's micro-batches evenly to its peers, slowed or not.
S-Oobleck: S2 updates the per-pipeline batch shares; S3 re-splits layers inside a pipeline's
template; re-instantiation after a fail-stop uses the measured speeds for both.
"""

from __future__ import annotations

from dataclasses import replace

from resihp.core.plan import split_by_weight
from resihp.sched.base import Decision
from resihp.sched.detector import greyhound_detector

from .common import resplit, reweight, switch, unchanged
from .greyhound import slow_devices
from .oobleck import Oobleck
from .recycle import ReCycle, recycle_plan


def replica_weights(plan, view) -> list[float]:
    """Measured relative speed of each replica: its slowest live device, times its slowest link."""
    out = []
    for stages in plan.replicas:
        devs = [x for st in stages for x in st.devices if view.alive[x]]
        w = min((view.speed[x] for x in devs), default=1.0)
        for a, b, f in view.links:
            if a in devs or b in devs:
                w = min(w, f)
        out.append(w)
    return out


class StrengthenedReCycle(ReCycle):
    """ReCycle plus Greyhound's fail-slow ladder (S2 re-weighting per DP replica)."""

    name = "recycle+greyhound"

    def detector(self, ctx):
        return greyhound_detector(ctx)

    def microbatches(self, ctx, plan, cluster) -> tuple[int, ...]:
        plan0 = ctx.home
        return split_by_weight(ctx.global_microbatches, replica_weights(plan0, cluster), 1)

    def decide(self, ctx, plan, cluster, reports) -> Decision:
        if any(r.kind in ("fail-stop", "rejoin") for r in reports):
            return super().decide(ctx, plan, cluster, reports)
        if not any(r.kind in ("fail-slow", "link-slow", "recovered") for r in reports):
            return unchanged(plan)
        new = recycle_plan(ctx, cluster, self.microbatches(ctx, plan, cluster))
        if new is None:
            return Decision(None, reason="every replica of a stage is dead")
        return switch(ctx, plan, new, cluster, "S2: re-weight micro-batches per DP replica")


class StrengthenedOobleck(Oobleck):
    """Oobleck plus Greyhound's fail-slow ladder (S2 batch shares, S3 re-split in templates)."""

    name = "oobleck+greyhound"
    speed_aware = True

    def detector(self, ctx):
        return replace(greyhound_detector(ctx), stop_s=1.5)

    def decide(self, ctx, plan, cluster, reports) -> Decision:
        if any(r.kind in ("fail-stop", "rejoin") for r in reports):
            return super().decide(ctx, plan, cluster, reports)
        if not any(r.kind in ("fail-slow", "link-slow", "recovered") for r in reports):
            return unchanged(plan)
        new = reweight(
            ctx, plan, [len(st) * w for st, w in zip(plan.replicas, replica_weights(plan, cluster))]
        )
        return switch(ctx, plan, new, cluster, "S2: re-weight pipeline batch shares")

    def escalations(self, ctx, plan, view) -> list[Decision]:
        if not slow_devices(view) or any(not view.alive[x] for x in plan.devices()):
            return []
        split = plan.with_changes(replicas=tuple(resplit(ctx, stages, view) for stages in plan.replicas))
        w = [len(st) * x for st, x in zip(split.replicas, replica_weights(split, view))]
        return [switch(ctx, plan, reweight(ctx, split, w), view, "S3: re-split layers")]
