"""The fault vocabulary and its one meaning, for the simulator, the scheduler and the runtime.

Vocabulary (`FaultSpec`): `stop`: a device exits; `slow`: a device computes at speed factor
`severity` in (0, 1); `link`: transfers between `src` and `dst` take 1/`severity` as long; `rejoin`:
a stopped device comes back healthy. Times are `at_s` (seconds) or `at_iter` (iteration);
`duration_s` ends a slow/link fault (omitted = persistent). Two keys refine a `stop` for the
runtime's fault injection (the simulator treats every stop alike): `phase` — when in iteration
`at_iter` the device fails: "start" (default, before its first instruction), "allreduce" (on
entering its first gradient all-reduce), "join" (while joining the next Plan generation that starts
at or after `at_iter`: a second failure during a rebuild); and `hang` — true: the process freezes
(alive but silent, like a hung GPU or a frozen node) instead of exiting.

Meaning (`check_faults`): `resihp simulate` (a scenario's faults) and `resihp train --faults` accept
or reject a fault list by these rules, with the same message:

- every device a fault names exists;
- a device's faults are all keyed one way, by `at_iter` or by `at_s` (a link fault keys both ends):
  the runtime maps seconds to iterations only while it runs, so the order of an `at_iter` and an
  `at_s` fault of one device is not known before;
- a fault lies inside the run: `start <= at_iter < iterations` where the run's length in iterations
  is known (`start` > 0 when a run resumes), `at_s < duration_s` where its length in seconds is;
- a link fault needs a link model (`links`; the runtime's `run.link_mb_per_s` > 0), else it would
  have no effect;
- within each domain, in time order (at one time: ends first, then onsets in list order): a stop of
  a dead device, a re-join of a live one, a slow or link fault touching a dead device, two faults
  on one device (or one link) at the same time, and a slow fault while another is active on its
  device (a link fault while another is active on its link) are rejected. A stop ends the device's
  slow fault (it re-joins healthy); a link fault outlives a stop of its ends. The `duration_s` of an
  `at_iter` fault ends at an iteration known only while the job runs, so such a fault counts as
  active until its device stops.

`timeline` turns a checked list into the time-ordered changes of the true cluster (`at_iter = k`
at k · iteration_s); `Change.report` is the one mapping of a change to the `FailureReport` a perfect
detector would send.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from .cluster import Cluster
from .report import FailureReport

FAULT_KINDS = ("stop", "slow", "link", "rejoin")
STOP_PHASES = ("start", "allreduce", "join")
_FAULT_KEYS = {"kind", "at_s", "at_iter", "device", "src", "dst", "severity", "duration_s", "phase", "hang"}
# the report a change of the true cluster becomes once detected (kind of `Change`)
REPORT_OF = {
    "stop": "fail-stop", "slow": "fail-slow", "link": "link-slow", "rejoin": "rejoin",
    "slow-end": "recovered", "link-end": "recovered",
}  # fmt: skip


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


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
        if self.at_s is not None and not (_number(self.at_s) and 0 <= self.at_s < math.inf):
            raise ValueError(f"faults.at_s = {self.at_s!r}: must be a finite number >= 0")
        if self.at_iter is not None and not (
            isinstance(self.at_iter, int) and not isinstance(self.at_iter, bool) and self.at_iter >= 0
        ):
            raise ValueError(f"faults.at_iter = {self.at_iter!r}: must be an integer >= 0")
        for key in ("device", "src", "dst"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise ValueError(f"faults.{key} = {value!r}: must be an integer device id")
        for key in ("severity", "duration_s"):
            value = getattr(self, key)
            if value is not None and not _number(value):
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
        if self.duration_s is not None and not 0 < self.duration_s < math.inf:
            raise ValueError(
                f"faults.duration_s = {self.duration_s!r}: must be a finite number > 0 (omit it: persistent)"
            )
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


def faults_from_tables(raw) -> tuple[FaultSpec, ...]:
    """The `[[faults]]` tables of a scenario or a faults file, in list order."""
    if not isinstance(raw, list):
        raise ValueError("faults: must be a list of [[faults]] tables")
    for k, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise ValueError(f"faults[{k}]: must be a table")
    return tuple(FaultSpec.from_dict(entry) for entry in raw)


def fault_key(f: FaultSpec) -> tuple:
    """What a fault occupies: its device, or its link (either direction)."""
    return ("link", *sorted(f.devices)) if f.kind == "link" else ("device", f.device)


def _at(f: FaultSpec) -> str:
    return f"at_iter {f.at_iter}" if f.at_iter is not None else f"at_s {f.at_s:g}"


def _where(k: int, f: FaultSpec) -> str:
    return f"faults[{k}] ({f.kind} {_at(f)})"


def _on(key: tuple) -> str:
    return f"device {key[1]}" if key[0] == "device" else f"link {list(key[1:])}"


def _span(devices: list[int]) -> str:
    if devices and devices == list(range(devices[0], devices[-1] + 1)):
        return f"{devices[0]}..{devices[-1]}"
    return str(devices)


def check_faults(
    faults: Iterable[FaultSpec],
    devices: Iterable[int],
    *,
    iterations: int | None = None,
    start: int = 0,
    duration_s: float | None = None,
    links: bool = True,
) -> tuple[FaultSpec, ...]:
    """The faults, iteration-keyed ones first, each domain in time order (list order at one time);
    ValueError naming the first fault that breaks a rule of the module docstring. `devices`: those
    of the job; `iterations` / `duration_s`: the run's end, when known; `start`: its first iteration."""
    faults = tuple(faults)
    known = set(devices)
    keyed: dict[int, int] = {}  # device -> its first fault: every other one must be keyed alike
    for k, f in enumerate(faults):
        for name in ("src", "dst") if f.kind == "link" else ("device",):
            dev = getattr(f, name)
            if dev not in known:
                allowed = _span(sorted(known))
                raise ValueError(f"faults[{k}].{name} = {dev}: no such device; allowed: {allowed}")
            j = keyed.setdefault(dev, k)
            if (faults[j].at_iter is None) != (f.at_iter is None):
                raise ValueError(
                    f"{_where(k, f)}: device {dev} also has {_where(j, faults[j])}; key all faults of "
                    "a device one way, by at_iter or by at_s"
                )
        if f.at_iter is not None and (
            f.at_iter < start or iterations is not None and f.at_iter >= iterations
        ):
            edge = "before the resumed run's start" if f.at_iter < start else "at or after the run's end"
            end = "" if iterations is None else f" < {iterations} (run.iterations)"
            raise ValueError(f"faults[{k}].at_iter = {f.at_iter}: {edge}; allowed: {start} <= at_iter{end}")
        if f.at_s is not None and duration_s is not None and f.at_s >= duration_s:
            raise ValueError(
                f"faults[{k}].at_s = {f.at_s:g}: at or after the run's end; allowed: "
                f"at_s < {duration_s:g} (run.duration_s)"
            )
        if f.kind == "link" and not links:
            raise ValueError(
                f"{_where(k, f)}: a link fault has no effect while run.link_mb_per_s = 0 (no link "
                "model); set run.link_mb_per_s > 0"
            )
    order = []
    for domain in ("at_iter", "at_s"):
        ks = sorted((k for k, f in enumerate(faults) if getattr(f, domain) is not None),
                    key=lambda k: (getattr(faults[k], domain), k))  # fmt: skip
        _check_domain(faults, ks, domain)
        order += ks
    return tuple(faults[k] for k in order)


def _check_domain(faults: tuple[FaultSpec, ...], ks: list[int], domain: str) -> None:
    """Replay the faults `ks` of one domain (all keyed by `domain`) against the rules."""
    steps = []  # (time, 0: end | 1: onset, fault index)
    for k in ks:
        f = faults[k]
        steps.append((getattr(f, domain), 1, k))
        if f.duration_s is not None and domain == "at_s":
            steps.append((f.at_s + f.duration_s, 0, k))
    steps.sort()
    dead: dict[int, int] = {}  # device -> the stop that killed it
    busy: dict[tuple, int] = {}  # device / link key -> its active slow / link fault
    taken: dict[tuple, int] = {}  # (key, time) -> the fault there
    for t, onset, k in steps:
        f, key = faults[k], fault_key(faults[k])
        if not onset:
            if busy.get(key) == k:
                del busy[key]
            continue
        if (key, t) in taken:
            j = taken[key, t]
            raise ValueError(
                f"{_where(k, f)}: {_on(key)} already has {_where(j, faults[j])} at that time; "
                "one fault per device (or link) at a time"
            )
        taken[key, t] = k
        if f.kind == "rejoin":
            if f.device not in dead:
                raise ValueError(
                    f"{_where(k, f)}: device {f.device} is alive; only a stopped device re-joins"
                )
            del dead[f.device]
            continue
        for dev in f.devices:
            if dev in dead:
                verb = "is already dead" if f.kind == "stop" else "is dead"
                raise ValueError(
                    f"{_where(k, f)}: device {dev} {verb} ({_where(dead[dev], faults[dead[dev]])})"
                )
        if f.kind == "stop":
            dead[f.device] = k
            busy.pop(key, None)  # a stop ends the device's slow fault
        elif key in busy:
            j = busy[key]
            why = (
                "end one (duration_s) before the next starts"
                if domain == "at_s"
                else "keyed by at_iter, a slow or link fault holds until its device stops (a duration_s "
                "ends at an iteration known only while the job runs); key both by at_s, the first "
                "with duration_s"
            )
            raise ValueError(f"{_where(k, f)}: overlaps {_where(j, faults[j])} on {_on(key)}; {why}")
        else:
            busy[key] = k


@dataclass(frozen=True)
class Change:
    """One change of the true cluster at `t_s`: a fault's onset (stop | slow | link | rejoin) or the
    end of a slow or link fault (slow-end | link-end). `link` = (lo, hi) for link changes."""

    t_s: float
    kind: str
    device: int = -1
    link: tuple[int, int] | None = None
    severity: float = 1.0

    def apply(self, cluster: Cluster) -> Cluster:
        if self.kind == "stop":
            return cluster.with_alive(self.device, False)
        if self.kind == "rejoin":
            return cluster.with_alive(self.device, True)
        if self.kind == "slow":
            return cluster.with_speed(self.device, self.severity)
        if self.kind == "slow-end":
            return cluster.with_speed(self.device, 1.0)
        a, b = self.link
        return cluster.with_link(a, b, self.severity if self.kind == "link" else 1.0)

    def report(self) -> FailureReport:
        """The report a detector sends once it sees this change (severity 0 for a stop, 1 for
        re-joins and ends)."""
        severity = {"stop": 0.0, "slow": self.severity, "link": self.severity}.get(self.kind, 1.0)
        if self.link is not None:
            return FailureReport(REPORT_OF[self.kind], (), link=self.link, severity=severity)
        return FailureReport(REPORT_OF[self.kind], (self.device,), severity=severity)

    def to_dict(self) -> dict:
        out: dict = {"t_s": round(self.t_s, 3), "kind": self.kind}
        if self.link is not None:
            out["link"] = list(self.link)
        else:
            out["device"] = self.device
        if self.kind in ("slow", "link"):
            out["severity"] = round(self.severity, 6)
        return out


def timeline(faults: Iterable[FaultSpec], iteration_s: float) -> list[Change]:
    """The changes of checked `faults` in time order (`at_iter = k` at k · iteration_s; at one time
    ends first, then onsets in list order); the end of a slow fault cut short by a stop is dropped."""
    steps = []
    for k, f in enumerate(faults):
        t = float(f.at_s) if f.at_s is not None else f.at_iter * iteration_s
        if f.kind == "link":
            ev = Change(t, "link", link=(min(f.src, f.dst), max(f.src, f.dst)), severity=f.severity)
        elif f.kind == "slow":
            ev = Change(t, "slow", device=f.device, severity=f.severity)
        else:
            ev = Change(t, f.kind, device=f.device)
        steps.append((t, 1, k, ev))
        if f.duration_s is not None:
            steps.append(
                (t + f.duration_s, 0, k, Change(t + f.duration_s, f"{f.kind}-end", ev.device, ev.link))
            )
    steps.sort(key=lambda s: s[:3])
    active: dict = {}  # device or link -> the fault whose end is due
    out = []
    for _, onset, k, ev in steps:
        where = ev.link or ev.device
        if not onset:
            if active.get(where) != k:
                continue  # the device stopped meanwhile: the slow ended with it
            del active[where]
        elif ev.kind in ("slow", "link"):
            active[where] = k
        elif ev.kind == "stop":
            active.pop(ev.device, None)
        out.append(ev)
    return out
