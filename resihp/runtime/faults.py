"""Fault injection for the runtime, in the simulator's `FaultSpec` vocabulary, keyed by iteration.

A faults TOML holds `[[faults]]` tables (`resihp.core.faults.FaultSpec` keys). The runtime applies
them at the start of iteration `at_iter`, on the device's worker:

* `stop`: the worker exits hard (`os._exit`) before running that iteration (`phase = "start"`), on
  entering its gradient all-reduce (`"allreduce"`), or while joining the next generation
  (`"join"`); with `hang = true` it freezes instead (SIGSTOP: alive but silent);
* `slow` (severity p): every compute instruction (F/B/W) sleeps t·(1/p − 1) after measuring its
  compute-only time t, from that iteration on (`duration_s` is not supported: persistent);
* `link` (severity f): a P2P block between `src` and `dst` (either direction) takes 1/f of its
  transfer time, max(measured, bytes / `run.link_mb_per_s`), counted from when both ends were ready
  (`worker.Worker._transfer`);
* `rejoin`: the controller starts a fresh worker process for the (stopped) device, which joins
  at that iteration boundary; the plan grows back (`reconfig.grow_plan`).

`validate_faults` rejects, with one ValueError before any process starts: a time-keyed fault
(`at_s`), a device outside the plan, two faults on one device (or link) at the same iteration, a fault on a
device already stopped (other than its `rejoin`), and a `rejoin` of a device that is not stopped.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable

from resihp.core.faults import FaultSpec


def load_faults(path: str) -> tuple[FaultSpec, ...]:
    """The `[[faults]]` tables of a TOML file; ValueError on anything else."""
    with open(path, "rb") as f:
        try:
            data = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{path}: not valid TOML: {e}") from None
    extra = sorted(set(data) - {"faults"})
    if extra:
        raise ValueError(f"{path}: unknown key {extra[0]!r}; a faults file holds [[faults]] tables")
    raw = data.get("faults", [])
    if not isinstance(raw, list) or not all(isinstance(x, dict) for x in raw):
        raise ValueError(f"{path}: faults must be [[faults]] tables")
    return tuple(FaultSpec.from_dict(x) for x in raw)


def validate_faults(faults: Iterable[FaultSpec], devices: Iterable[int]) -> tuple[FaultSpec, ...]:
    """The faults, sorted by iteration; ValueError on the first impossible or contradictory one."""
    devices = set(devices)
    faults = tuple(sorted(faults, key=lambda f: (f.at_iter if f.at_iter is not None else -1, f.kind)))
    stopped: dict[int, int] = {}
    active: dict[tuple, FaultSpec] = {}
    for f in faults:
        if f.at_iter is None:
            raise ValueError(f"faults[{f.kind}] at_s = {f.at_s}: the runtime keys faults by at_iter")
        for dev in f.devices:
            if dev not in devices:
                raise ValueError(
                    f"faults[{f.kind}] names device {dev}, which is not in the plan "
                    f"(devices {sorted(devices)})"
                )
            if dev in stopped and f.kind != "rejoin":
                raise ValueError(
                    f"faults[{f.kind}] at_iter {f.at_iter} names device {dev}, "
                    f"stopped at iteration {stopped[dev]}"
                )
        if f.kind == "rejoin":
            if f.device not in stopped or stopped[f.device] >= f.at_iter:
                raise ValueError(
                    f"faults[rejoin] device {f.device} at_iter {f.at_iter}: the device is live "
                    "(a rejoin needs an earlier stop of it)"
                )
            del stopped[f.device]
        if f.duration_s is not None:
            raise ValueError(f"faults[{f.kind}] duration_s: runtime faults are persistent")
        key = ("link", *sorted(f.devices)) if f.kind == "link" else ("device", f.device)
        if (key, f.at_iter) in active:
            other = active[key, f.at_iter]
            raise ValueError(
                f"contradictory faults: {f.kind} and {other.kind} at iteration {f.at_iter} "
                f"on {key[0]} {list(key[1:])}"
            )
        active[key, f.at_iter] = f
        if f.kind == "stop":
            stopped[f.device] = f.at_iter
    return faults


def faults_at(
    faults: Iterable[FaultSpec], device: int, it: int
) -> tuple[FaultSpec | None, float, dict[int, float]]:
    """(the `stop` fault of iteration `it` (phase start or allreduce) or None, compute speed p,
    {peer device: link factor f}) for `device` at iteration `it`."""
    stop, slow, link = None, 1.0, {}
    for f in faults:
        if f.at_iter > it or device not in f.devices:
            continue
        if f.kind == "stop" and f.at_iter == it and f.phase != "join":
            stop = f
        elif f.kind == "slow":
            slow = float(f.severity)
        elif f.kind == "link":
            link[f.dst if device == f.src else f.src] = float(f.severity)
    return stop, slow, link


def join_stop(faults: Iterable[FaultSpec], device: int, start: int) -> FaultSpec | None:
    """The `stop` fault with phase "join" that hits `device` while it joins a generation starting at
    iteration `start` (the first generation it joins at or after the fault's `at_iter`; a fresh
    process of a device that re-joined since is not hit again), or None."""
    faults = tuple(faults)
    rejoins = [f.at_iter for f in faults if f.kind == "rejoin" and f.device == device and f.at_iter <= start]
    back = max(rejoins, default=-1)
    for f in faults:
        if f.kind == "stop" and f.phase == "join" and f.device == device and back < f.at_iter <= start:
            return f
    return None
