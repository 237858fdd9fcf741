"""`resihp detect bench`: the paper's accuracy protocol on synthetic jobs (`jobs.JobModel`).

Per setting (tokens per micro-batch × length distribution × fault) `jobs` short jobs of `iters`
iterations; half get a persistent fault at a uniform onset in [50, iters − 50): compute W/M/S (one
device slowed so that the noise-free iteration time grows ×1/0.65, ×1/0.45, ×1/0.30: the paper's
35/55/70% throughput loss) or `link` (one TP rank pair between adjacent stages, bandwidth cut to the
same ×1/0.65). The healthy half of a (tokens, lengths) pair is shared by its four fault settings.

Per job: the MTP is fitted per (stage, F/B/W) on the first `warmup` iterations (all healthy; onset
>= 50), per-link transfer times are calibrated as their warm-up medians, the ITP (`BatchDag` on the
Program) predicts every iteration from its actual micro-batches, and each detector sees iterations
`warmup..iters−1`. Definitions (docs/detector.md):

- an alarm raised at iteration t < onset, or dated (change point) before onset − 3, is false;
  the first other alarm of a faulty job is its detection; the job stops there (it would replan);
- a job is *correct* iff it has no false alarm and, if faulty, it is detected;
- latency = detection iteration − onset (0: alarmed at the onset iteration itself);
- localization: at the detection, `Localizer` on the compute-only chunk times and per-link piece
  times of that iteration alone (3·m samples per device; a 2-iteration window mixes in a healthy
  one when the alarm comes at the onset); correct iff its worst report names the device (link);
  severity error = |estimate − truth| / truth of that report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from resihp.cost.calibration import fit_linear_time

from .jobs import LAYOUTS, JobModel
from .localize import LocalizeConfig, Localizer
from .replay import DEFAULT_DETECTORS, make_detectors

RATIOS = {"W": 1 / 0.65, "M": 1 / 0.45, "S": 1 / 0.30, "link": 1 / 0.65}
DATE_TOLERANCE = 3


@dataclass(frozen=True)
class BenchConfig:
    jobs: int = 400
    iters: int = 300
    seed: int = 0
    warmup: int = 30
    seq_lens: tuple[int, ...] = tuple(LAYOUTS)
    lengths: tuple[str, ...] = ("github", "c4")
    faults: tuple[str, ...] = ("W", "M", "S", "link")
    block: int = 25
    burst_prob: float = 0.02  # long-document bursts per iteration (jobs.py); 0 = independent lengths
    detectors: dict = field(default_factory=lambda: dict(DEFAULT_DETECTORS))

    def __post_init__(self) -> None:
        if not isinstance(self.jobs, int) or self.jobs < 2:
            raise ValueError(f"bench --jobs {self.jobs!r}: must be an integer >= 2")
        if self.iters < 120:
            raise ValueError(f"bench iters = {self.iters}: must be >= 120 (onset in [50, iters − 50))")
        if not 0.0 <= self.burst_prob < 1.0:
            raise ValueError(f"bench --burst-prob {self.burst_prob!r}: must lie in [0, 1)")
        for f in self.faults:
            if f not in RATIOS:
                raise ValueError(f"bench fault {f!r}: allowed: {', '.join(RATIOS)}")

    def make_detectors(self) -> dict:
        return make_detectors(self.detectors)


def _predict(jm: JobModel, blk, warmup: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per job: fitted chunk predictions (J, T, pp, 3, m), piece predictions (J, pp−1, tp), ITP (J, T)."""
    jobs, _, pp, tp, _, m = blk.device_s.shape
    n = np.full((warmup, tp, m), float(jm.seq_len))
    chunk = np.empty((jobs, blk.sum_sq.shape[1], pp, 3, m))
    for j in range(jobs):
        sq_w = np.broadcast_to(blk.sum_sq[j, :warmup, None, :], (warmup, tp, m))
        for s in range(pp):
            for k in range(3):
                fit = fit_linear_time(n, sq_w, blk.device_s[j, :warmup, s, :, k, :])
                chunk[j, :, s, k, :] = fit.predict(float(jm.seq_len), blk.sum_sq[j])
    piece = np.median(blk.piece_s[:, :warmup], axis=(1, 2, 4))  # (J, pp−1, tp)
    xfer = np.broadcast_to(piece.max(-1)[:, None, :, None], (jobs, 2, pp - 1, m))
    itp = jm.iteration_s(chunk, xfer[:, None])
    return chunk, piece, itp


def _localize(jm: JobModel, blk, j: int, at: int, chunk, piece) -> list:
    loc = Localizer(LocalizeConfig(window_iters=1))
    pp, tp, m = jm.pp, jm.tp, jm.m
    dev_ids = np.broadcast_to(jm.devices[:, :, None, None], (pp, tp, 3, m)).ravel()
    a, b = jm.devices[:-1], jm.devices[1:]
    pairs = np.broadcast_to(np.stack([a, b], -1)[None, :, None], (2, pp - 1, m, tp, 2)).reshape(-1, 2)
    pred = np.broadcast_to(chunk[j, at][:, None], (pp, tp, 3, m)).ravel()
    lp = np.broadcast_to(piece[j][None, :, None, :], (2, pp - 1, m, tp)).ravel()
    loc.observe_arrays(at, dev_ids, blk.device_s[j, at].ravel(), pred, pairs, blk.piece_s[j, at].ravel(), lp)
    return loc.localize(at)


def _run_job(cfg: BenchConfig, obs, pred, onset: int | None) -> dict:
    """Per detector: (false alarms, detection iteration or None)."""
    out = {}
    for name, det in cfg.make_detectors().items():
        false, found = 0, None
        for t in range(cfg.warmup, obs.size):
            alarm = det.observe(t, float(obs[t]), float(pred[t]))
            if alarm is None:
                continue
            if onset is None or t < onset or alarm.iteration < onset - DATE_TOLERANCE:
                false += 1
            else:
                found = t
                break
        out[name] = (false, found)
    return out


def _faults(jm: JobModel, rng, count: int, kind: str, iters: int, severity: dict) -> list:
    out = []
    for _ in range(count):
        onset = int(rng.integers(50, iters - 50))
        rank = int(rng.integers(0, jm.tp))
        if kind == "link":
            where = int(rng.integers(0, jm.pp - 1))
            out.append(("link", onset, where, rank, severity[("link", where)]))
        else:
            where = int(rng.integers(0, jm.pp))
            out.append(("slow", onset, where, rank, severity[(kind, where)]))
    return out


def run_group(cfg: BenchConfig, jm: JobModel, key: tuple, kind: str | None, count: int, severity: dict,
              progress: Callable[[str], None]) -> tuple[list, list, list]:  # fmt: skip
    """`count` jobs of one fault kind (None: healthy): per job its fault, results, and MAPE terms."""
    faults_all, results, mapes = [], [], []
    for b0 in range(0, count, cfg.block):
        rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, *key, b0]))
        size = min(cfg.block, count - b0)
        faults = [None] * size if kind is None else _faults(jm, rng, size, kind, cfg.iters, severity)
        blk = jm.block(rng, size, cfg.iters, faults)
        chunk, piece, itp = _predict(jm, blk, cfg.warmup)
        for j, fault in enumerate(faults):
            onset = None if fault is None else fault[1]
            end = cfg.iters if onset is None else onset
            dev = blk.device_s[j, cfg.warmup : end]
            pr = np.broadcast_to(chunk[j, cfg.warmup : end][:, :, None], dev.shape)
            mapes.append((np.abs(pr / dev - 1).sum(), dev.size,
                          np.abs(itp[j, cfg.warmup : end] / blk.observed_s[j, cfg.warmup : end] - 1).sum(),
                          end - cfg.warmup))  # fmt: skip
            res = _run_job(cfg, blk.observed_s[j], itp[j], onset)
            for name, (false, found) in res.items():
                loc = None
                if found is not None:
                    reports = _localize(jm, blk, j, found, chunk, piece)
                    loc = _score_localization(jm, fault, reports)
                res[name] = (false, found, loc)
            results.append(res)
            faults_all.append(fault)
        progress(f"  {key} {kind or 'healthy'}: {b0 + size}/{count} jobs")
    return faults_all, results, mapes


def _score_localization(jm: JobModel, fault, reports) -> tuple[bool, float]:
    if not reports:
        return (False, float("nan"))
    top = reports[0]
    kind, _, where, rank, sev = fault
    if kind == "slow":
        ok = top.kind == "fail-slow" and top.devices == (int(jm.devices[where, rank]),)
    else:
        link = tuple(sorted((int(jm.devices[where, rank]), int(jm.devices[where + 1, rank]))))
        ok = top.kind == "link-slow" and tuple(top.link) == link
    return (ok, abs(top.severity - sev) / sev)


def summarize(healthy: list, faulty: list, faults: list, names) -> dict:
    """Metrics of one setting per detector (definitions in the module docstring)."""
    out = {}
    for name in names:
        h = [r[name] for r in healthy]
        f = [r[name] for r in faulty]
        correct = sum(1 for fa, _, _ in h if fa == 0) + sum(1 for fa, d, _ in f if fa == 0 and d is not None)
        lat = [d - fault[1] for (_, d, _), fault in zip(f, faults) if d is not None]
        locs = [loc for _, d, loc in f if d is not None and loc is not None]
        jobs = len(h) + len(f)
        out[name] = {
            "accuracy": round(correct / jobs, 4),
            "detection_rate": round(len(lat) / max(len(f), 1), 4),
            "false_alarms_per_job": round(sum(x[0] for x in h + f) / jobs, 4),
            "healthy_jobs_with_alarm": round(sum(1 for x in h if x[0]) / max(len(h), 1), 4),
            "median_latency_iters": float(np.median(lat)) if lat else None,
            "p90_latency_iters": float(np.percentile(lat, 90)) if lat else None,
            "localization_accuracy": round(sum(ok for ok, _ in locs) / len(locs), 4) if locs else None,
            "severity_within_10pct": round(sum(e <= 0.10 for _, e in locs) / len(locs), 4) if locs else None,
        }
    return out


def _mape_pct(terms: list) -> tuple[float, float]:
    a = np.array(terms, dtype=np.float64).sum(axis=0)
    return round(100 * a[0] / a[1], 3), round(100 * a[2] / a[3], 3)


def run_pair(cfg: BenchConfig, seq: int, li: int, progress: Callable[[str], None] = lambda s: None) -> tuple:
    """One (tokens, lengths) pair: its settings and the raw per-job results, for pooling."""
    lengths = cfg.lengths[li]
    progress(f"setting {seq} tokens, {lengths} lengths")
    jm = JobModel(seq, lengths, pool_seed=cfg.seed, burst_prob=cfg.burst_prob)
    severity = {}
    for kind in cfg.faults:
        what = "link" if kind == "link" else "slow"
        for w in range(jm.pp - 1 if kind == "link" else jm.pp):
            severity[(kind, w)] = jm.severity_for(RATIOS[kind], what, w)
    nh = cfg.jobs // 2
    _, healthy, hm = run_group(cfg, jm, (seq, li, 0), None, nh, severity, progress)
    settings, faulty_all, faults_all, mapes = [], [], [], list(hm)
    for fi, kind in enumerate(cfg.faults):
        faults, faulty, fm = run_group(cfg, jm, (seq, li, fi + 1), kind, cfg.jobs - nh, severity, progress)
        faulty_all += faulty
        faults_all += faults
        mapes += fm
        mtp, itp = _mape_pct(hm + fm)
        where = range(jm.pp - 1 if kind == "link" else jm.pp)
        settings.append({
            "seq_len": seq, "lengths": lengths, "fault": kind, "jobs": cfg.jobs, "faulty_jobs": cfg.jobs - nh,
            "severity_by_location": [round(severity[(kind, w)], 4) for w in where],
            "mtp_mape_pct": mtp, "itp_mape_pct": itp,
            "detectors": summarize(healthy, faulty, faults, list(cfg.detectors)),
        })  # fmt: skip
    return settings, healthy, faulty_all, faults_all, mapes


def quiet(msg: str) -> None:
    pass


def run_bench(cfg: BenchConfig, progress: Callable[[str], None] = quiet, workers: int = 1) -> dict:
    """The whole protocol; the result is JSON-ready and a function of `cfg` alone (byte-identical
    for any `workers`: every job's randomness is keyed by (seed, tokens, lengths, fault, block)).
    With `workers` > 1, `progress` must be picklable (a module-level function)."""
    pairs = [(seq, li) for seq in cfg.seq_lens for li in range(len(cfg.lengths))]
    if workers > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(min(workers, len(pairs))) as ex:
            futures = [ex.submit(run_pair, cfg, seq, li, progress) for seq, li in pairs]
            parts = []
            for (seq, li), fut in zip(pairs, futures):
                parts.append(fut.result())
                progress(f"done: {seq} tokens, {cfg.lengths[li]} lengths")
    else:
        parts = [run_pair(cfg, seq, li, progress) for seq, li in pairs]
    settings, healthy, faulty, faults, mapes = [], [], [], [], []
    for st, h, f, fl, m in parts:
        settings += st
        healthy += h
        faulty += f
        faults += fl
        mapes += m
    mtp, itp = _mape_pct(mapes)
    return {
        "jobs": cfg.jobs,
        "seed": cfg.seed,
        "iterations_per_job": cfg.iters,
        "warmup_iters": cfg.warmup,
        "burst_prob": cfg.burst_prob,
        "detector_configs": {k: {"mode": m, **c} for k, (m, c) in cfg.detectors.items()},
        "detectors": summarize(healthy, faulty, faults, list(cfg.detectors)),
        "mtp_mape_pct": mtp,
        "itp_mape_pct": itp,
        "settings": settings,
    }
