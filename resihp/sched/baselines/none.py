"""No mitigation (baselines.md §2.1): degraded under fail-slows; a fail-stop hangs, then aborts."""

from __future__ import annotations

from resihp.sched.base import Decision, Policy
from resihp.sim.detection import HANG_S, DetectorSpec

from .common import unchanged


class NoMitigation(Policy):
    name = "none"

    def detector(self, job) -> DetectorSpec:
        return DetectorSpec(stop_s=HANG_S)  # ranks hang in the next collective until a timeout

    def adapt(self, job, plan, cluster, reports) -> Decision:
        if any(r.kind == "fail-stop" for r in reports):
            return Decision(None, reason="fail-stop: hang timeout, job aborted")
        return unchanged(plan)
