"""Run the detectors over a measured (or synthesized) run: warm-up MTP fit, ITP, change points, blame.

Input is a sequence of `Sample`s, one per iteration: the Plan generation, the observed iteration
time and every compute chunk's compute-only time per device (what the runtime's trace records).
Per Plan generation: the first `warmup` iterations fit the MTP per (group, F/B/W) and build the
`ITP` (refit after every Plan change); from then on each iteration's healthy time is predicted from
its actual micro-batches, the detectors see (observed, predicted), and the `Localizer` sees each
device's measured/predicted chunk times. An alarm asks the Localizer to blame a device (or link).
A Plan change restarts the series: the old level means nothing under the new Plan. Right after each
warm-up the Localizer checks the first predicted iteration once (`warmup_reports`): a device that was
already slow during the warm-up is baked into its stage's fit, but still stands out from its TP
peers (not when it is alone in its stage).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from resihp.core.model_spec import ModelSpec
from resihp.core.plan import Plan, build_stage
from resihp.cost.calibration import fit_linear_times

from .changepoint import DetectorConfig, GreyhoundDetector, ResiHPDetector
from .itp import ITP
from .localize import LocalizeConfig, Localizer
from .trace_io import TraceRecord, by_iteration

DEFAULT_DETECTORS = {
    "resihp": ("normalize", {"min_shift": 0.05, "persist_all": True}),
    "resihp-filter": ("filter", {}),
    "greyhound": ("greyhound", {}),
}
KIND_NAMES = ("F", "B", "W")


@dataclass(frozen=True)
class Sample:
    """One iteration. Chunk rows: device, group (replica, stage), kind 0/1/2, global micro-batch."""

    iteration: int
    generation: int
    observed_s: float
    devices: np.ndarray  # (n,)
    groups: list[tuple[int, int]]  # (n,)
    kinds: np.ndarray  # (n,)
    mbs: np.ndarray  # (n,)
    compute_s: np.ndarray  # (n,)
    links: np.ndarray | None = None  # (k, 2) device pairs of P2P pieces, when measured
    link_s: np.ndarray | None = None  # (k,) their wire times


def layout_plan(records: list[TraceRecord], schedule: str) -> Plan:
    """The Plan structure one iteration's records imply (replicas, stages, TP groups, micro-batches)."""
    groups: dict[tuple[int, int], dict[int, int]] = {}
    mbs: dict[int, set] = {}
    for r in records:
        groups.setdefault((r.replica, r.stage), {})[r.tp_rank] = r.device
        for op, src, mb, _, _ in r.instrs:
            if op == "F":
                mbs.setdefault(src, set()).add(mb)
    dp = 1 + max(d for d, _ in groups)
    pp = [1 + max(i for d, i in groups if d == rep) for rep in range(dp)]
    tp = max(len(v) for v in groups.values())
    model = ModelSpec("trace-layout", max(pp), 64 * 8 * tp, 8 * tp, 8 * tp, 256 * tp, 256)
    replicas = []
    for rep in range(dp):
        stages = []
        for i in range(pp[rep]):
            ranks = groups.get((rep, i))
            if not ranks:
                raise ValueError(f"trace: no records for replica {rep} stage {i}")
            stages.append(build_stage(model, [ranks[k] for k in sorted(ranks)], (i, i + 1)))
        replicas.append(tuple(stages))
    m = tuple(len(mbs.get(rep, ())) or 1 for rep in range(dp))
    return Plan(model, tuple(replicas), m, schedule)


def samples_from_trace(records: list[TraceRecord], schedule: str) -> tuple[list[Sample], dict[int, Plan]]:
    """Per iteration: observed = max wall time over devices; chunk rows from F/B/W instructions.

    Under gpipe/1f1b the W instruction is a no-op (the backward is one pass): its time is added to B.
    """
    plans: dict[int, Plan] = {}
    out = []
    for recs in by_iteration(records):
        gen = recs[0].generation
        if gen not in plans:
            plans[gen] = layout_plan(recs, schedule)
        plan = plans[gen]
        dev, grp, kind, mb, t = [], [], [], [], []
        for r in recs:
            chunks: dict[tuple[int, int, int], float] = {}
            for op, src, j, c, _ in r.instrs:
                if op in KIND_NAMES:
                    k = KIND_NAMES.index(op)
                    if k == 2 and schedule != "zbh1":
                        k = 1  # fold the no-op W into its B
                    chunks[(k, src, j)] = chunks.get((k, src, j), 0.0) + c
            for (k, src, j), c in chunks.items():
                dev.append(r.device)
                grp.append((r.replica, r.stage))
                kind.append(k)
                mb.append(plan.mb_offset(src) + j)
                t.append(c)
        out.append(Sample(recs[0].iter, gen, max(r.wall_s for r in recs), np.array(dev), grp, np.array(kind),
                          np.array(mb), np.array(t)))  # fmt: skip
    return out, plans


def make_detectors(configs: dict) -> dict:
    out = {}
    for name, (mode, cfg) in configs.items():
        c = DetectorConfig(**cfg)
        out[name] = GreyhoundDetector(c) if mode == "greyhound" else ResiHPDetector(c, mode=mode)
    return out


def replay(
    samples: Iterable[Sample],
    plans: dict[int, Plan],
    batch: Callable[[int, int], tuple[np.ndarray, np.ndarray]],
    warmup: int = 10,
    detectors: dict | None = None,
    itp_options: dict | None = None,
    watch: tuple[float, int] | None = None,
) -> dict:
    """Detections per detector. `batch(iteration, G)` gives (tokens, sum_sq) of the G micro-batches;
    `itp_options` go to `ITP` (p2p, step_s, ...). ITP MAPE counts iterations before the first alarm.

    `watch = (factor, k)`: always-on localization, no iteration-time alarm needed: a device (link)
    whose estimated factor is below `factor` in k consecutive iterations is reported once
    (`localizer_alarms`)."""
    configs = detectors or DEFAULT_DETECTORS
    state: dict = {"gen": None}
    result = {name: {"alarms": [], "reports": []} for name in configs}
    mape_terms: list[float] = []
    warmup_reports: list[dict] = []
    watched: list[dict] = []
    for s in samples:
        if s.generation != state["gen"]:
            state = {"gen": s.generation, "rows": [], "n": 0, "itp": None, "dets": make_detectors(configs),
                     "loc": Localizer(LocalizeConfig(window_iters=1))}  # fmt: skip
        plan = plans[s.generation]
        tokens, sum_sq = batch(s.iteration, plan.global_microbatches)
        if s.links is not None:
            link_pred = _link_pred(state, s)
        if state["itp"] is None:
            state["rows"] += [
                (int(d), g, KIND_NAMES[k], tokens[j], sum_sq[j], c)
                for d, g, k, j, c in zip(s.devices, s.groups, s.kinds, s.mbs, s.compute_s)
                if c > 0
            ]
            state["n"] += 1
            if state["n"] >= warmup:
                rows = state["rows"]
                state["itp"] = ITP.fit_devices(plan, [(d, *r) for d, _, *r in rows], **(itp_options or {}))
                # Localization compares each device with one robust fit over its TP group.
                state["group_fits"] = fit_linear_times(((g, k), n, q, t) for _, g, k, n, q, t in rows)
                state["check"] = True
            continue
        itp: ITP = state["itp"]
        predicted = itp.predict(tokens, sum_sq)
        if not any(r["alarms"] for r in result.values()):
            mape_terms.append(abs(predicted / s.observed_s - 1.0))
        fits = state["group_fits"]
        pred_chunks = np.array([
            fits[(g, KIND_NAMES[k])].predict(tokens[j], sum_sq[j]) if (g, KIND_NAMES[k]) in fits else c
            for g, k, j, c in zip(s.groups, s.kinds, s.mbs, s.compute_s)
        ])  # fmt: skip
        keep = (s.compute_s > 0) & (pred_chunks > 0)
        state["loc"].observe_arrays(
            s.iteration, s.devices[keep], s.compute_s[keep], pred_chunks[keep], s.links,
            s.link_s, None if s.links is None else link_pred,
        )  # fmt: skip
        if state.pop("check", False):  # a device already slow in the warm-up stands out from its peers
            warmup_reports += [r.to_dict() for r in state["loc"].localize(s.iteration)]
        if watch is not None:
            watched += _watch(state, s.iteration, *watch)
        for name, det in state["dets"].items():
            alarm = det.observe(s.iteration, s.observed_s, predicted)
            if alarm is None:
                continue
            result[name]["alarms"].append(
                {"iteration": alarm.iteration, "detected_at": alarm.detected_at,
                 "shift": round(alarm.shift, 4), "generation": s.generation}
            )  # fmt: skip
            result[name]["reports"] += [r.to_dict() for r in state["loc"].localize(s.iteration)]
    itp_mape = round(100 * float(np.mean(mape_terms)), 3) if mape_terms else None
    out = {"detectors": result, "warmup_reports": warmup_reports, "itp_mape_pct": itp_mape}
    if watch is not None:
        out["localizer_alarms"] = watched
    return out


def _watch(state: dict, iteration: int, factor: float, k: int) -> list[dict]:
    """Suspects below `factor` now; report the ones that have been for k iterations in a row."""
    now = {(r.kind, r.devices, r.link): r for r in state["loc"].localize(iteration) if r.severity < factor}
    streak = {key: state.get("streak", {}).get(key, 0) + 1 for key in now}
    state["streak"] = streak
    blamed = state.setdefault("blamed", set())
    fresh = [key for key, n in streak.items() if n >= k and key not in blamed]
    blamed.update(fresh)
    return [now[key].to_dict() for key in fresh]


def _link_pred(state: dict, s: Sample) -> np.ndarray:
    """Per-link healthy wire time: the median of that link's first observed pieces (calibration)."""
    cal = state.setdefault("link_cal", {})
    out = np.empty(len(s.link_s))
    for k, (pair, t) in enumerate(zip(map(tuple, s.links), s.link_s)):
        hist = cal.setdefault(pair, [])
        if len(hist) < 8:
            hist.append(float(t))
        out[k] = float(np.median(hist))
    return out
