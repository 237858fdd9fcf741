"""Plain checkpoint-restart (baselines.md §2.2): every failure is a restart on the healthy devices.

Fail-stop seen by hang detection (10 min); fail-slow and slow links by hand after 60 min, then
excluded like a fail-stop. A restart costs u0 = 10 min plus the work since the last checkpoint
(uniform on [0, 60 min], seeded). A re-join that lets DP grow triggers a planned restart (u0, no
lost work). No spare nodes.
"""

from __future__ import annotations

from resihp.sched.base import Decision, Policy
from resihp.sched.detector import HANG_S, DetectorSpec

from .common import MANUAL_SLOW_S, link_excluded, restart, restart_plan, unchanged


class CheckpointRestart(Policy):
    """Plain checkpoint-restart: every failure is a restart on the healthy devices."""

    name = "checkpoint-restart"

    def detector(self, ctx) -> DetectorSpec:
        return DetectorSpec(stop_s=HANG_S, slow_iters=0.0, link_iters=0.0, extra_s=MANUAL_SLOW_S)

    def decide(self, ctx, plan, cluster, reports) -> Decision:
        kinds = {r.kind for r in reports}
        exclude = link_excluded(cluster)
        used = set(plan.devices())
        hung = any(not cluster.alive[x] for x in used)
        slowed = any(cluster.speed[x] < 1.0 for x in used) or bool(exclude & used)
        if hung or (kinds & {"fail-slow", "link-slow"} and slowed):
            return restart(ctx, plan, cluster, exclude)
        if "rejoin" in kinds:
            new = restart_plan(ctx, cluster, exclude)
            if new is not None and new.dp > plan.dp:
                return restart(ctx, plan, cluster, exclude, lose_work=False, reason="planned restart")
        return unchanged(plan)
