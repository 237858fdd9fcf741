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
        if self.kind == "link-slow" and self.link is None:
            raise ValueError("a link-slow report names its link (src, dst)")

    def to_dict(self) -> dict:
        out = {"kind": self.kind, "devices": list(self.devices), "severity": round(self.severity, 4)}
        if self.link is not None:
            out["link"] = list(self.link)
        return out
