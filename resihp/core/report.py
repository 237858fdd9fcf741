"""What the Detector tells the Scheduler: one failure, located, with its severity."""

from __future__ import annotations

from dataclasses import dataclass

REPORT_KINDS = ("fail-stop", "fail-slow", "link-slow", "rejoin", "recovered")


@dataclass(frozen=True)
class FailureReport:
    """`devices` for fail-stop / fail-slow / rejoin / recovered; `link` = (src, dst) for link-slow.

    `severity` is the speed factor p (fail-slow) or bandwidth factor f (link-slow) in (0, 1], 1 for
    rejoin/recovered, 0 for fail-stop. `confidence` in [0, 1]; `iteration` when it was detected.
    """

    kind: str
    devices: tuple[int, ...] = ()
    link: tuple[int, int] | None = None
    severity: float = 0.0
    confidence: float = 1.0
    iteration: int = -1

    def __post_init__(self) -> None:
        if self.kind not in REPORT_KINDS:
            raise ValueError(f"report kind {self.kind!r}: allowed: {', '.join(REPORT_KINDS)}")
        if (self.link is not None) != (self.kind == "link-slow") and self.kind != "recovered":
            raise ValueError(f"a {self.kind} report names a link only when it is link-slow")
        if not (0.0 <= self.severity <= 1.0 and 0.0 <= self.confidence <= 1.0):
            raise ValueError(f"report severity {self.severity} / confidence {self.confidence}: need [0, 1]")

    def to_dict(self) -> dict:
        """JSON event, as in `resihp train --json` (architecture §5.5)."""
        out = {
            "iter": self.iteration, "kind": self.kind, "devices": list(self.devices),
            "severity": round(self.severity, 4), "confidence": round(self.confidence, 4),
        }  # fmt: skip
        if self.link is not None:
            out["link"] = list(self.link)
        return out
