"""`FailureReport`: what the Detector hands to the Scheduler and the runtime (defined in core)."""

from resihp.core.report import REPORT_KINDS, FailureReport

__all__ = ["REPORT_KINDS", "FailureReport"]
