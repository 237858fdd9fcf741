"""Adaptra (baselines.md §2.6): slow PP links only; CPU-path transfers and an adapted schedule.

Once a slow link is localized (Greyhound's latency), (1) PP communication goes through host
memory and CPU-side RDMA, so a slow transfer no longer blocks later compute kernels: the cost
model's `send_blocks` is off while any slow link is known; (2) the schedule keeps more forwards in
flight so the extra transfer delay is absorbed instead of cascading. Our Program has no knob for
"k more warm-up forwards", so the candidates are the job's schedule and its extreme, GPipe (every
forward in flight), checked against activation memory; the DAG-predicted faster one is kept. When
the link recovers, the job's schedule returns. Compute fail-slows: no action. Fail-stops and re-joins:
plain checkpoint-restart (hang detection, restart, planned restart when DP can grow).
"""

from __future__ import annotations

from dataclasses import replace

from resihp.sched.base import Decision, Policy, Reconfig
from resihp.sched.detector import HANG_S, greyhound_detector
from resihp.sched.model import fits_memory

from .checkpoint import CheckpointRestart
from .common import next_generation, unchanged

CANDIDATES = ("gpipe",)


def _time(ctx, plan, view) -> float:
    from resihp.evaluator.predict import predict

    return predict(ctx, plan, view, send_blocks=False).iteration_s


class Adaptra(Policy):
    """Adaptra: slow PP links over the CPU path and a schedule with more forwards in flight."""

    name = "adaptra"

    def detector(self, ctx):
        return replace(greyhound_detector(ctx), stop_s=HANG_S, slow_iters=None)

    def cost_options(self, view) -> dict:
        return {"send_blocks": False} if view.links else {}

    def decide(self, ctx, plan, cluster, reports) -> Decision:
        if any(r.kind in ("fail-stop", "rejoin") for r in reports) or any(
            not cluster.alive[x] for x in plan.devices()
        ):
            return CheckpointRestart().decide(ctx, plan, cluster, reports)
        if not any(r.kind in ("link-slow", "recovered") for r in reports):
            return unchanged(plan)
        best = plan.with_changes(schedule=ctx.schedule)
        if cluster.links:
            t_best = _time(ctx, best, cluster)
            for schedule in CANDIDATES:
                cand = plan.with_changes(schedule=schedule)
                under = replace(ctx, home=ctx.home.with_changes(schedule=schedule))  # its memory model
                if fits_memory(under, cand) and _time(ctx, cand, cluster) < t_best:
                    best, t_best = cand, _time(ctx, cand, cluster)
        if best.schedule == plan.schedule:
            return unchanged(plan, "slow link: PP transfers over the CPU path")
        return Decision(next_generation(plan, best), Reconfig(), reason=f"schedule -> {best.schedule}")
