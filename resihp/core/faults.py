"""The fault vocabulary shared by simulator, scheduler and runtime fault injection.

`stop`: a device exits; `slow`: a device computes at speed factor `severity` in (0, 1);
`link`: transfers between `src` and `dst` take 1/`severity` as long; `rejoin`: a stopped device
comes back healthy. Times are `at_s` (seconds) or `at_iter` (iteration); `duration_s` ends a
slow/link fault (omitted = persistent).

Two keys refine a `stop` for the runtime's fault injection (the simulator treats every stop alike):
`phase` — when in iteration `at_iter` the device fails: "start" (default, before its first
instruction), "allreduce" (on entering its first gradient all-reduce), "join" (while joining the
next Plan generation that starts at or after `at_iter`: a second failure during a rebuild); and
`hang` — true: the process freezes (alive but silent, like a hung GPU or a frozen node) instead
of exiting.
"""

from __future__ import annotations

from dataclasses import dataclass

FAULT_KINDS = ("stop", "slow", "link", "rejoin")
STOP_PHASES = ("start", "allreduce", "join")
_FAULT_KEYS = {"kind", "at_s", "at_iter", "device", "src", "dst", "severity", "duration_s", "phase", "hang"}


@dataclass(frozen=True)
class FaultSpec:
    kind: str
    at_s: float | None = None
    at_iter: int | None = None
    device: int | None = None
    src: int | None = None
    dst: int | None = None
    severity: float | None = None
    duration_s: float | None = None
    phase: str = "start"
    hang: bool = False

    def __post_init__(self) -> None:
        where = f"faults[{self.kind}]"
        if not isinstance(self.kind, str) or self.kind not in FAULT_KINDS:
            raise ValueError(f"faults.kind = {self.kind!r}: allowed: {', '.join(FAULT_KINDS)}")
        if (self.at_s is None) == (self.at_iter is None):
            raise ValueError(f"{where}: give exactly one of at_s or at_iter")
        if self.at_s is not None and not (isinstance(self.at_s, int | float) and self.at_s >= 0):
            raise ValueError(f"faults.at_s = {self.at_s!r}: must be a number >= 0")
        if self.at_iter is not None and not (
            isinstance(self.at_iter, int) and not isinstance(self.at_iter, bool) and self.at_iter >= 0
        ):
            raise ValueError(f"faults.at_iter = {self.at_iter!r}: must be an integer >= 0")
        for key in ("device", "src", "dst"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise ValueError(f"faults.{key} = {value!r}: must be an integer device id")
        for key in ("at_s", "severity", "duration_s"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, int | float) or isinstance(value, bool)):
                raise ValueError(f"faults.{key} = {value!r}: must be a number")
        if self.kind == "link":
            if self.src is None or self.dst is None or self.device is not None:
                raise ValueError(f"{where}: a link fault names src and dst, not device")
            if self.src == self.dst:
                raise ValueError(f"faults.dst = {self.dst!r}: must differ from src")
        elif self.device is None or self.src is not None or self.dst is not None:
            raise ValueError(f"{where}: names one device (device = ID), not src/dst")
        if self.kind in ("slow", "link"):
            if self.severity is None or not (0.0 < float(self.severity) < 1.0):
                raise ValueError(
                    f"faults.severity = {self.severity!r}: a {self.kind} fault needs a factor in (0, 1)"
                )
        elif self.severity is not None or self.duration_s is not None:
            raise ValueError(f"{where}: severity and duration_s apply only to slow and link faults")
        if self.duration_s is not None and not (
            isinstance(self.duration_s, int | float) and self.duration_s > 0
        ):
            raise ValueError(f"faults.duration_s = {self.duration_s!r}: must be a number > 0")
        if self.phase not in STOP_PHASES:
            raise ValueError(f"faults.phase = {self.phase!r}: allowed: {', '.join(STOP_PHASES)}")
        if not isinstance(self.hang, bool):
            raise ValueError(f"faults.hang = {self.hang!r}: must be true or false")
        if self.kind != "stop" and (self.phase != "start" or self.hang):
            raise ValueError(f"{where}: phase and hang apply only to stop faults")

    @classmethod
    def from_dict(cls, raw: dict) -> FaultSpec:
        unknown = sorted(set(raw) - _FAULT_KEYS)
        if unknown:
            raise ValueError(f"faults.{unknown[0]}: unknown key; allowed: {', '.join(sorted(_FAULT_KEYS))}")
        if "kind" not in raw:
            raise ValueError(f"faults.kind: missing; allowed: {', '.join(FAULT_KINDS)}")
        return cls(**raw)

    @property
    def devices(self) -> tuple[int, ...]:
        return (self.src, self.dst) if self.kind == "link" else (self.device,)
