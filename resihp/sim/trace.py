"""A fault list turned into a checked, time-ordered trace of state changes of the true cluster.

Semantics of contradictory traces (tested):

- `at_iter = k` means `at_s = k · t0`, t0 the fault-free iteration time, so every policy meets the
  same physical fault at the same moment;
- a stop of a device that is already dead, a re-join of a live device, and a slow or link fault on
  a dead device raise ValueError;
- overlapping slow faults on one device (or link faults on one link) raise ValueError;
- a stop while a device is slow is allowed: the slow ends with the stop (its scheduled end is
  dropped) and the device re-joins healthy;
- events at the same time apply in list order.
"""

from __future__ import annotations

from dataclasses import dataclass

from resihp.core.cluster import Cluster
from resihp.core.faults import FaultSpec


@dataclass(frozen=True)
class TraceEvent:
    """One change of the true cluster. kind: stop | slow | link | rejoin | slow-end | link-end."""

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

    def to_dict(self) -> dict:
        out: dict = {"t_s": round(self.t_s, 3), "kind": self.kind}
        if self.link is not None:
            out["link"] = list(self.link)
        else:
            out["device"] = self.device
        if self.kind in ("slow", "link"):
            out["severity"] = round(self.severity, 6)
        return out


def _where(k: int, f: FaultSpec) -> str:
    return f"faults[{k}] ({f.kind} at {f.at_s if f.at_s is not None else f'iteration {f.at_iter}'})"


def build_trace(faults: tuple[FaultSpec, ...], cluster: Cluster, iteration_s: float) -> list[TraceEvent]:
    """The checked trace of `faults` on `cluster`; ValueError names the offending fault."""
    timed = []
    for k, f in enumerate(faults):
        for dev in f.devices:
            cluster.check_device(dev, f"faults[{k}].device")
        t = float(f.at_s) if f.at_s is not None else f.at_iter * iteration_s
        timed.append((t, k, f))
    timed.sort(key=lambda x: (x[0], x[1]))
    # Expand into onsets and ends, then replay to check consistency.
    raw: list[tuple[float, int, int, TraceEvent]] = []
    for t, k, f in timed:
        if f.kind == "link":
            ev = TraceEvent(t, "link", link=(min(f.src, f.dst), max(f.src, f.dst)), severity=f.severity)
        elif f.kind == "slow":
            ev = TraceEvent(t, "slow", device=f.device, severity=f.severity)
        else:
            ev = TraceEvent(t, f.kind, device=f.device)
        raw.append((t, 0, k, ev))
        if f.duration_s is not None:
            end = TraceEvent(t + f.duration_s, ev.kind + "-end", ev.device, ev.link)
            raw.append((t + f.duration_s, 0, k, end))
    raw.sort(key=lambda x: (x[0], x[2], x[3].kind.endswith("-end")))
    alive = list(cluster.alive)
    slow_until: dict[int, int] = {}  # device -> fault index of its current slow
    link_on: dict[tuple[int, int], int] = {}
    out: list[TraceEvent] = []
    for _, _, k, ev in raw:
        f = faults[k]
        d = ev.device
        if ev.kind == "stop":
            if not alive[d]:
                raise ValueError(f"{_where(k, f)}: device {d} is already dead")
            alive[d] = False
            slow_until.pop(d, None)
        elif ev.kind == "rejoin":
            if alive[d]:
                raise ValueError(f"{_where(k, f)}: device {d} is alive; only a stopped device re-joins")
            alive[d] = True
        elif ev.kind == "slow":
            if not alive[d]:
                raise ValueError(f"{_where(k, f)}: device {d} is dead")
            if d in slow_until:
                raise ValueError(
                    f"{_where(k, f)}: overlaps faults[{slow_until[d]}] on device {d}; "
                    "end one slow fault (duration_s) before the next starts"
                )
            slow_until[d] = k
        elif ev.kind == "slow-end":
            if slow_until.get(d) != k:
                continue  # the device stopped meanwhile: the slow ended with it
            del slow_until[d]
        elif ev.kind == "link":
            if not (alive[ev.link[0]] and alive[ev.link[1]]):
                raise ValueError(f"{_where(k, f)}: link {list(ev.link)} touches a dead device")
            if ev.link in link_on:
                raise ValueError(
                    f"{_where(k, f)}: overlaps faults[{link_on[ev.link]}] on link {list(ev.link)}"
                )
            link_on[ev.link] = k
        else:  # link-end
            if link_on.get(ev.link) != k:
                continue
            del link_on[ev.link]
        out.append(ev)
    return out
