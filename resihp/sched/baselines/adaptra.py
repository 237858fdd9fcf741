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
from resihp.sched.model import fits_memory
from resihp.sim.detection import HANG_S, greyhound_detector

from .checkpoint import CheckpointRestart
from .common import next_generation, unchanged

CANDIDATES = ("gpipe",)


def _time(job, plan, view) -> float:
    from resihp.sim.predict import predict

    return predict(job, plan, view, send_blocks=False).iteration_s


class Adaptra(Policy):
    name = "adaptra"

    def detector(self, job):
        return replace(greyhound_detector(job), stop_s=HANG_S, slow_iters=None)

    def cost_options(self, view) -> dict:
        return {"send_blocks": False} if view.links else {}

    def adapt(self, job, plan, cluster, reports) -> Decision:
        if any(r.kind in ("fail-stop", "rejoin") for r in reports) or any(
            not cluster.alive[x] for x in plan.devices()
        ):
            return CheckpointRestart().adapt(job, plan, cluster, reports)
        if not any(r.kind in ("link-slow", "recovered") for r in reports):
            return unchanged(plan)
        best = plan.with_changes(schedule=job.schedule)
        if cluster.links:
            t_best = _time(job, best, cluster)
            for schedule in CANDIDATES:
                cand = plan.with_changes(schedule=schedule)
                if fits_memory(replace(job, schedule=schedule), cand) and _time(job, cand, cluster) < t_best:
                    best, t_best = cand, _time(job, cand, cluster)
        if best.schedule == plan.schedule:
            return unchanged(plan, "slow link: PP transfers over the CPU path")
        return Decision(next_generation(plan, best), Reconfig(), reason=f"schedule -> {best.schedule}")
