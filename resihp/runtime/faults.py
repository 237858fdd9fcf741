"""Fault injection for the runtime, in the simulator's `FaultSpec` vocabulary, keyed by iteration or time.

A faults TOML holds `[[faults]]` tables (`resihp.core.faults.FaultSpec` keys). The runtime applies
them at the start of iteration `at_iter`, on the device's worker:

* `stop`: the worker exits hard (`os._exit`) before running that iteration (`phase = "start"`), on
  entering its gradient all-reduce (`"allreduce"`), or while joining the next generation
  (`"join"`); with `hang = true` it freezes instead (SIGSTOP: alive but silent);
* `slow` (severity p): every compute instruction (F/B/W) sleeps t·(1/p − 1) after measuring its
  compute-only time t, from that iteration on (until its end, with `duration_s`);
* `link` (severity f): a P2P block between `src` and `dst` (either direction) takes 1/f of its
  transfer time, max(measured, bytes / `run.link_mb_per_s`), counted from when both ends were ready
  (`worker.Worker._transfer`); until its end, with `duration_s`;
* `rejoin`: the controller starts a fresh worker process for the (stopped) device, which joins
  at that iteration boundary; the plan grows back (`reconfig.grow_plan`).

Time is resolved to iterations in one place, the controller (`TimedFaults`): a time-keyed fault
(`at_s`) and the end of a `duration_s` fault take effect at the iteration after the first commit
at or after their time. From then on they are iteration-keyed faults (`FaultSpec` with `at_iter`)
and end markers (`FaultEnd`), which is all that members see (`faults_at`, `join_stop`).

Which fault lists are accepted, and what overlapping or contradictory faults mean, is
`resihp.core.faults.check_faults` — the same rules and messages as `resihp simulate`;
`checks.check_run` (run by `resihp train` before the runtime loads, and by `run_training`) applies
it with the run's devices, iterations (and resume start) and link model before any process starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from resihp.core.faults import FaultSpec, fault_key, faults_from_tables
from resihp.core.files import read_toml


@dataclass(frozen=True)
class FaultEnd:
    """Runtime-internal: the (iteration-keyed) slow or link `fault` ends at iteration `at_iter`."""

    fault: FaultSpec
    at_iter: int


def load_faults(path: str, what: str = "run.faults") -> tuple[FaultSpec, ...]:
    """The `[[faults]]` tables of the TOML file `path` (`what`: how the user named it); ValueError
    on a missing or unreadable file, invalid TOML, or anything but `[[faults]]` tables."""
    data = read_toml(path, what)
    extra = sorted(set(data) - {"faults"})
    if extra:
        raise ValueError(f"{what} {path}: unknown key {extra[0]!r}; a faults file holds [[faults]] tables")
    return faults_from_tables(data.get("faults", []))


class TimedFaults:
    """The controller's resolution of time to iterations, against a clock it reads at every commit.

    `faults` (validated) start as the iteration-keyed faults; `resolve(it, elapsed_s)`, called when
    iteration `it` commits `elapsed_s` after the clock's origin, appends to it (and returns):

    * every pending time-keyed fault with `at_s` <= elapsed_s, as `replace(f, at_s=None, at_iter=it +
      1)` — at most one per device or link per commit (the others wait for the next one, in `at_s`
      order), so a stop and its rejoin never land on one iteration;
    * `FaultEnd(f, it + 1)` for every active fault with `duration_s` whose start time + duration_s
      <= elapsed_s. A fault starts when it is resolved (time-keyed), at the commit of `at_iter` − 1
      (iteration-keyed), or at the origin (iteration-keyed with `at_iter` <= `start`).

    Nothing is resolved for an iteration at or past `end` (it would never run). `injected` holds
    (fault as given, at_iter, elapsed_s) of every resolved time-keyed fault; `started`, the start
    time of every fault with a duration that started; `active`, those not ended yet.
    """

    def __init__(self, faults: Iterable[FaultSpec], start: int = 0, end: int | None = None) -> None:
        faults = tuple(faults)
        self.end = end
        self.faults: list[FaultSpec | FaultEnd] = [f for f in faults if f.at_iter is not None]
        self.pending = sorted((f for f in faults if f.at_s is not None), key=lambda f: f.at_s)
        self.injected: list[tuple[FaultSpec, int, float]] = []
        self.waiting = [f for f in self.faults if f.duration_s is not None and f.at_iter > start]
        self.started = {f: 0.0 for f in self.faults if f.duration_s is not None and f.at_iter <= start}
        self.active = set(self.started)

    def resolve(self, it: int, elapsed_s: float) -> list[FaultSpec | FaultEnd]:
        if self.end is not None and it + 1 >= self.end:
            return []
        new: list[FaultSpec | FaultEnd] = []
        for f in sorted(self.active, key=lambda f: (self.started[f], f.at_iter, f.devices)):
            if elapsed_s >= self.started[f] + f.duration_s:
                self.active.remove(f)
                new.append(FaultEnd(f, it + 1))
        for f in [f for f in self.waiting if f.at_iter <= it + 1]:
            self.waiting.remove(f)
            self.started[f] = elapsed_s
            self.active.add(f)
        taken: set[tuple] = set()
        for f in list(self.pending):
            if f.at_s > elapsed_s:
                break
            if fault_key(f) in taken:
                continue
            taken.add(fault_key(f))
            self.pending.remove(f)
            got = dataclasses.replace(f, at_s=None, at_iter=it + 1)
            self.injected.append((f, it + 1, elapsed_s))
            if got.duration_s is not None:
                self.started[got] = elapsed_s
                self.active.add(got)
            new.append(got)
        self.faults.extend(new)
        return new


def inject_event(
    f: FaultSpec, at_iter: int, given: FaultSpec | None = None, elapsed_s: float | None = None
) -> dict:
    """The event of fault `f` taking effect at iteration `at_iter`: {"iter", "kind": "inject-KIND",
    "devices"} with its `severity`, `duration_s`, the `phase` and `hang` of a stop that is not a
    plain exit at the iteration's start; for a time-keyed fault (`given`: as the user gave it) its
    `at_s` and `elapsed_s`, the controller's clock when it resolved it."""
    event = {"iter": at_iter, "kind": f"inject-{f.kind}", "devices": list(f.devices)}
    if f.kind == "stop" and (f.phase != "start" or f.hang):
        event.update(phase=f.phase, hang=f.hang)
    if f.severity is not None:
        event["severity"] = f.severity
    if f.duration_s is not None:
        event["duration_s"] = f.duration_s
    if given is not None and given.at_s is not None:
        event.update(at_s=given.at_s, elapsed_s=elapsed_s)
    return event


def end_event(end: FaultEnd, lasted_s: float) -> dict:
    """The event of a `duration_s` fault that ends at iteration `end.at_iter` after `lasted_s`."""
    f = end.fault
    return {
        "iter": end.at_iter,
        "kind": "fault-end",
        "fault": f.kind,
        "devices": list(f.devices),
        "duration_s": f.duration_s,
        "lasted_s": lasted_s,
    }


def faults_at(
    faults: Iterable[FaultSpec | FaultEnd], device: int, it: int
) -> tuple[FaultSpec | None, float, dict[int, float]]:
    """(the `stop` fault of iteration `it` (phase start or allreduce) or None, compute speed p,
    {peer device: link factor f}) for `device` at iteration `it`; of several active slow faults of a
    device (or link faults of a link), the one with the latest `at_iter` applies; a fault with a
    `FaultEnd` at or before `it` is over, and a slow fault ends with a stop of its device (which
    re-joins healthy, as `core.faults` says)."""
    faults = tuple(faults)
    over = {e.fault for e in faults if isinstance(e, FaultEnd) and e.at_iter <= it}
    stops = [
        f.at_iter for f in faults if isinstance(f, FaultSpec) and f.kind == "stop" and f.device == device
    ]
    stop, slow, link = None, (-1, 1.0), {}
    for f in faults:
        if isinstance(f, FaultEnd) or f in over or f.at_iter > it or device not in f.devices:
            continue
        if f.kind == "stop" and f.at_iter == it and f.phase != "join":
            stop = f
        elif f.kind == "slow" and any(f.at_iter < s < it for s in stops):
            continue
        elif f.kind == "slow" and f.at_iter >= slow[0]:
            slow = (f.at_iter, float(f.severity))
        elif f.kind == "link":
            peer = f.dst if device == f.src else f.src
            if f.at_iter >= link.get(peer, (-1,))[0]:
                link[peer] = (f.at_iter, float(f.severity))
    return stop, slow[1], {peer: v[1] for peer, v in link.items()}


def join_stop(faults: Iterable[FaultSpec | FaultEnd], device: int, start: int) -> FaultSpec | None:
    """The `stop` fault with phase "join" that hits `device` while it joins a generation starting at
    iteration `start` (the first generation it joins at or after the fault's `at_iter`; a fresh
    process of a device that re-joined since is not hit again), or None."""
    faults = tuple(f for f in faults if isinstance(f, FaultSpec))
    rejoins = [f.at_iter for f in faults if f.kind == "rejoin" and f.device == device and f.at_iter <= start]
    back = max(rejoins, default=-1)
    for f in faults:
        if f.kind == "stop" and f.phase == "join" and f.device == device and back < f.at_iter <= start:
            return f
    return None
