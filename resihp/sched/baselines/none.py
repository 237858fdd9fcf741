"""No mitigation (baselines.md §2.1): degraded under fail-slows; a fail-stop hangs, then aborts."""

from __future__ import annotations

from resihp.sched.base import Decision, Policy
from resihp.sched.detector import HANG_S, DetectorSpec

from .common import unchanged


class NoMitigation(Policy):
    """No mitigation: degraded under fail-slows; a fail-stop hangs, then aborts."""

    name = "none"

    def detector(self, ctx) -> DetectorSpec:
        return DetectorSpec(stop_s=HANG_S)  # ranks hang in the next collective until a timeout

    def decide(self, ctx, plan, cluster, reports) -> Decision:
        if any(r.kind == "fail-stop" for r in reports):
            return Decision(None, reason="fail-stop: hang timeout, job aborted")
        return unchanged(plan)
