"""Seeded fault generators (cost-model.md §8.2–§8.3): `faults = { generator = NAME, ... }`.

- `stop-every`: ResiHP's stress preset. One device is killed per event (the paper "kills a subset
  of worker processes"; we kill one worker each time) every `interval_s` from `start_s`, monotone,
  until half the cluster is dead. Victim order: replica by replica (seeded order); within a replica
  one device of every stage's TP group per round, for tp/2 rounds, so each TP group loses at most
  half its devices and the 30-min preset ends with 50% of the GPUs alive.
- `fail-slow`: one compute fail-slow (first half of the run) then one link fail-slow (second half),
  or either alone (`kind`), each calibrated so the unmitigated throughput drops by the level's
  share: W / M / S = 35 / 55 / 70% (bisection on the factor with the job simulator's timer).
- `mixed`: fail-stop alternating with a medium fail-slow every `interval_s`; optional re-joins.
- `llama3-rates`: Poisson fail-stops (per GPU, 60% GPU / 40% node) and fail-slows (per node,
  80% link) at the Llama 3 / Greyhound rates, lognormal repair and fail-slow durations.

The arguments, their defaults and their rules are `resihp.core.scenario.GENERATOR_ARGS` (checked when a
scenario loads, by `generator_args`): unknown keys or bad values raise ValueError naming the key,
the value and what is allowed.
"""

from __future__ import annotations

import math
import random

from resihp.core.cluster import Cluster
from resihp.core.faults import FaultSpec
from resihp.core.scenario import GENERATOR_ARGS, LEVELS, Job, generator_args


def kill_order(job: Job, rng: random.Random) -> list[int]:
    """Devices in the order `stop-every` kills them (see the module docstring)."""
    plan = job.initial_plan()
    replicas = list(range(plan.dp))
    rng.shuffle(replicas)
    out = []
    for r in replicas:
        groups = [list(st.devices) for st in plan.replicas[r]]
        for g in groups:
            rng.shuffle(g)
        for k in range(max(1, job.tp // 2)):
            out += [g[k] for g in groups]
    return out


def calibrate(job: Job, timer, drop: float, device: int | None = None, link=None) -> float:
    """Speed (or bandwidth) factor making the unmitigated throughput drop by `drop` (bisection)."""
    if not 0.0 < drop < 1.0:
        raise ValueError(f"drop = {drop!r}: must lie in (0, 1)")
    plan = job.initial_plan()
    healthy = timer.iteration_s(plan, job.cluster)

    def ratio(x: float) -> float:
        c = job.cluster.with_speed(device, x) if link is None else job.cluster.with_link(*link, x)
        return healthy / timer.iteration_s(plan, c)

    lo, hi = (-6.0, 0.0)  # log10 of the factor
    for _ in range(18):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ratio(10**mid) < 1.0 - drop else (lo, mid)
    return round(10 ** ((lo + hi) / 2), 6)


def pp_link(job: Job, rng: random.Random) -> tuple[int, int]:
    """A stage-boundary link of replica 0 (TP rank 0 to TP rank 0), or a DP link if pp = 1."""
    plan = job.initial_plan()
    stages = plan.replicas[0]
    if len(stages) == 1:
        return stages[0].devices[0], plan.replicas[min(1, plan.dp - 1)][0].devices[-1]
    s = rng.randrange(len(stages) - 1)
    return stages[s].devices[0], stages[s + 1].devices[0]


def _stop_every(job, a, horizon_s, timer, rng) -> list[FaultSpec]:
    victims = kill_order(job, rng)[: int(job.cluster.num_devices * a["max_fraction"])]
    out = []
    for k, dev in enumerate(victims):
        t = a["start_s"] + k * a["interval_s"]
        if t >= horizon_s:
            break
        out.append(FaultSpec("stop", at_s=t, device=dev))
        if a["rejoin_after_s"] > 0 and t + a["rejoin_after_s"] < horizon_s:
            out.append(FaultSpec("rejoin", at_s=t + a["rejoin_after_s"], device=dev))
    return out


def _fail_slow(job, a, horizon_s, timer, rng) -> list[FaultSpec]:
    drop = LEVELS[a["level"]]
    device = rng.randrange(job.cluster.num_devices)
    link = pp_link(job, rng)
    kinds = ["compute", "link"] if a["kind"] == "both" else [a["kind"]]
    span = (horizon_s - a["start_s"]) / len(kinds)
    out = []
    for k, kind in enumerate(kinds):
        t = a["start_s"] + k * span
        dur = span if len(kinds) > 1 and k == 0 else None
        if kind == "compute":
            p = calibrate(job, timer, drop, device=device)
            out.append(FaultSpec("slow", at_s=t, device=device, severity=p, duration_s=dur))
        else:
            f = calibrate(job, timer, drop, link=link)
            out.append(FaultSpec("link", at_s=t, src=link[0], dst=link[1], severity=f, duration_s=dur))
    return out


def _mixed(job, a, horizon_s, timer, rng) -> list[FaultSpec]:
    order = kill_order(job, rng)
    half = job.cluster.num_devices // 2
    victims, spared = order[:half], sorted(set(range(job.cluster.num_devices)) - set(order[:half]))
    rng.shuffle(spared)
    p = calibrate(job, timer, LEVELS[a["level"]], device=spared[0]) if spared else 0.5
    out = []
    for k in range(len(victims) + len(spared)):
        t = a["start_s"] + k * a["interval_s"]
        if t >= horizon_s or k // 2 >= (len(victims) if k % 2 == 0 else len(spared)):
            break
        if k % 2 == 0:
            dev = victims[k // 2]
            out.append(FaultSpec("stop", at_s=t, device=dev))
            if a["rejoin_after_s"] > 0 and t + a["rejoin_after_s"] < horizon_s:
                out.append(FaultSpec("rejoin", at_s=t + a["rejoin_after_s"], device=dev))
        else:
            out.append(FaultSpec("slow", at_s=t, device=spared[k // 2], severity=p))
    return out


def _llama3_rates(job, a, horizon_s, timer, rng) -> list[FaultSpec]:
    c: Cluster = job.cluster
    n, gpn = c.num_devices, c.gpus_per_node
    rate_stop = n * a["stop_rate_per_gpu_h"] / 3600.0
    rate_slow = c.nodes * a["slow_rate_per_node_h"] / 3600.0
    total = rate_stop + rate_slow
    dead_until = [0.0] * n  # time a dead device re-joins (0: alive)
    busy_until: dict = {}  # device or link -> end of its current slow
    out: list[FaultSpec] = []
    t = 0.0
    while total > 0:
        t += rng.expovariate(total)
        if t >= horizon_s:
            break
        alive = [d for d in range(n) if dead_until[d] <= t]
        if not alive:
            continue
        dev = rng.choice(alive)
        if rng.random() < rate_stop / total:
            unit = [x for x in range(dev - dev % gpn, dev - dev % gpn + gpn) if x in alive]
            if rng.random() >= 0.4:
                unit = [dev]
            repair = a["repair_median_s"] * math.exp(rng.gauss(0.0, 1.0))
            for d in unit:
                out.append(FaultSpec("stop", at_s=round(t, 3), device=d))
                dead_until[d] = t + repair
                if t + repair < horizon_s:
                    out.append(FaultSpec("rejoin", at_s=round(t + repair, 3), device=d))
            continue
        is_link = rng.random() < 0.8
        severity = rng.choice((0.65, 0.45, 0.30))
        mean = 1440.0 if is_link else 600.0
        dur = min(max(mean * math.exp(rng.gauss(-(1.5**2) / 2, 1.5)), 30.0), 36000.0)
        end = t + dur
        if is_link:
            peer = (dev + gpn) % n
            key = (min(dev, peer), max(dev, peer))
            if peer == dev or dead_until[peer] > t or busy_until.get(key, 0.0) > t or dead_until[dev] > t:
                continue
            busy_until[key] = end
            out.append(FaultSpec("link", at_s=round(t, 3), src=key[0], dst=key[1], severity=severity,
                                 duration_s=round(dur, 3)))  # fmt: skip
        elif busy_until.get(dev, 0.0) <= t:
            busy_until[dev] = end
            out.append(
                FaultSpec("slow", at_s=round(t, 3), device=dev, severity=severity, duration_s=round(dur, 3))
            )
    return out


GENERATORS = {
    "stop-every": _stop_every,
    "fail-slow": _fail_slow,
    "mixed": _mixed,
    "llama3-rates": _llama3_rates,
}
assert set(GENERATORS) == set(GENERATOR_ARGS), "every generator has its arguments in core.scenario"


def generate(job: Job, generator: dict, horizon_s: float, timer, seed: int) -> tuple[FaultSpec, ...]:
    """The fault list of `generator` (a scenario's `faults = {...}` table) over `horizon_s`."""
    name, args = generator_args(generator)
    rng = random.Random(f"{name}:{seed}")
    faults = GENERATORS[name](job, args, horizon_s, timer, rng)
    return tuple(sorted(faults, key=lambda f: f.at_s))
