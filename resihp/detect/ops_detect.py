"""Fail-slow devices and stage imbalance in a per-operation trace of another training system
(`ops_trace.OpsTrace`), which carries compute times but no sequence lengths.

Without lengths there is no micro-batch time predictor: a device is judged against *the devices
doing the same work* instead. Per (rank, step) its compute time is Σ forward + backward compute.

`fail_slow`. A rank's reference at a step is the median compute time, at that step, of the ranks
of its stage in the other DP replicas (same layers), scaled by how much more or less work its own
replica had at that step than theirs (other documents; measured on the replica's other stages,
which see the same documents, so a burst of long documents cancels while a slow device, in one
stage only, stays visible). With no other replica in the trace the reference is the median of the
other ranks of its stage and replica (its TP peers: same work). Its relative time (own ÷
reference) goes through the detect package's change-point stage (`ChangePointStage`: BOCPD, mean
shift, persistence; restarted at each confirmed change; then each segment backwards in time, for
changes too close to the start or to the previous change), whose changes, either way, cut the
rank's steps into segments. Each segment is judged by the `Localizer` rule (speed = median of
reference ÷ own time; slow when below 1 − threshold with >= min_samples steps). Consecutive slow
segments form one episode, reported with `first_step` = its first step (the change point, or the
rank's first step if it was slow from the start) and `speed` over the episode. A stage that simply
has more work is never blamed: its devices' references have that work too.

`stage_imbalance`. Per DP replica and step, a stage's time is the median over its ranks (steps in
a fail-slow episode left out) and its ratio is that ÷ the median over the replica's stages at
that step (needs >= 2 stages; with 2, their mean). A stage whose median ratio over steps exceeds
1 + `imbalance` in every replica that has it is a partitioning problem, not a device fault.

Limits: when the trace's compute rows include the TP collectives inside the layers (Megatron's
do), a slow device drags its TP peers to its pace, and every rank of that TP group present in the
trace is reported; which one is the culprit is not visible in compute time. A rank with no peer
(DP 1 and alone in its stage) cannot be judged (`unjudged`). With PP 1 a replica has no other
stage to measure its workload on, so length jitter between replicas is not cancelled. With DP 1
and a whole TP group slowed, the group has no peer either: the slowdown shows as stage imbalance
(if it covers most steps) or not at all.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

from .changepoint import ChangePointStage, DetectorConfig
from .localize import LocalizeConfig, Localizer
from .ops_trace import OpsTrace


@dataclass(frozen=True)
class OpsDetectConfig:
    slow: LocalizeConfig = field(default_factory=LocalizeConfig)  # the slow-segment rule (one rank each)
    change: DetectorConfig = field(default_factory=DetectorConfig)  # the change-point stage
    imbalance: float = 0.20  # a stage > (1 + imbalance) × the median stage, in every replica

    def __post_init__(self) -> None:
        if not self.imbalance > 0:
            raise ValueError(f"ops.imbalance = {self.imbalance!r}: must be > 0")


@dataclass(frozen=True)
class OpsReport:
    ranks: int  # ranks in the trace
    steps: int  # distinct steps with compute rows
    fail_slow: list[dict]  # {"rank", "stage", "dp_rank", "speed", "first_step"}, by rank then step
    stage_imbalance: list[dict]  # {"stage", "ratio"}, by stage
    unjudged: list[int]  # ranks with no peer doing the same work at any of their steps

    def to_dict(self) -> dict:
        keys = ("ranks", "steps", "fail_slow", "stage_imbalance")
        return {k: getattr(self, k) for k in keys}


def _nanmedian(a: np.ndarray, axis: int) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices give NaN, as wanted
        return np.nanmedian(a, axis=axis)


def _references(times: np.ndarray, dp: np.ndarray, stage: np.ndarray) -> np.ndarray:
    """Per rank and step: the time its peers took, scaled to its replica's documents.

    Peers: the ranks of its stage in the other replicas (median), else its TP peers. Against other
    replicas, the replica's own workload at that step (its documents' share of long ones, which
    every stage of it sees alike) is the median over its *other* stages of their time ÷ their
    other-replica peers' time; a slow device is in one stage only, so it stays visible."""
    n = len(dp)
    ref = np.full_like(times, np.nan)
    cross = np.zeros(n, dtype=bool)
    shared: dict[tuple[int, int], np.ndarray] = {}  # (dp_rank, stage) -> its other-replica median
    for i in range(n):
        peers = (stage == stage[i]) & (dp != dp[i])
        cross[i] = peers.any()
        if cross[i]:
            cell = (int(dp[i]), int(stage[i]))
            if cell not in shared:
                shared[cell] = _nanmedian(times[peers], axis=0)
            ref[i] = shared[cell]
            continue
        peers = (stage == stage[i]) & (np.arange(n) != i)
        if peers.any():
            ref[i] = _nanmedian(times[peers], axis=0)
    rel = times / ref  # (rank, step)
    cells = {(int(d), int(s)) for d, s in zip(dp[cross], stage[cross])}
    level = {c: _nanmedian(rel[cross & (dp == c[0]) & (stage == c[1])], axis=0) for c in cells}
    for i in np.flatnonzero(cross):
        others = [level[c] for c in cells if c[0] == dp[i] and c[1] != stage[i]]
        if others:
            work = _nanmedian(np.array(others), axis=0)
            ref[i] *= np.where(np.isnan(work), 1.0, work)
    return ref


def _localizer(rank: int, own: np.ndarray, ref: np.ndarray, config: LocalizeConfig) -> Localizer:
    """A Localizer holding these steps of one rank (measured = own time, predicted = reference)."""
    loc = Localizer(config)
    loc.observe_arrays(0, np.full(own.size, rank), own, ref)
    return loc


def _forward_cuts(steps: np.ndarray, x: np.ndarray, config: DetectorConfig) -> list[int]:
    """Indices where a confirmed change (either way) starts a new level of `x` over `steps`.

    After each change the stage restarts from the change point, so that the next change is judged
    against the new level alone (a recovery compared with a window that still reaches back before
    the slowdown would look like no change). A restart needs `min_before` points of the new level
    before it can confirm the next change."""
    cuts: list[int] = []
    k = 0
    cp = ChangePointStage(config)
    while k < steps.size:
        det = cp.push(int(steps[k]), float(x[k]))
        k += 1
        if det is not None:
            k = int(np.searchsorted(steps, det.change_iteration))
            cuts.append(k)
            cp = ChangePointStage(config)
    return cuts


def _change_points(steps: np.ndarray, x: np.ndarray, config: DetectorConfig) -> list[int]:
    """`_forward_cuts`, then each segment between them once more backwards in time: a change
    within `min_before` points after the trace's start or after a previous change (a slowdown in
    the first steps, a short slow episode's recovery) has too little history before it, but
    enough after it."""
    fwd = _forward_cuts(steps, x, config)
    cuts = set(fwd)
    bounds = [0, *fwd, steps.size]
    for lo, hi in zip(bounds, bounds[1:]):
        # A change starting at reversed index r ends the earlier level at forward index hi - 1 - r.
        back = _forward_cuts(-steps[lo:hi][::-1], x[lo:hi][::-1], config)
        cuts.update(hi - r for r in back)
    return sorted(cuts)


def _episodes(rank: int, steps: np.ndarray, own: np.ndarray, ref: np.ndarray, config: OpsDetectConfig):
    """(first step, speed, mask over `steps`) of each slow episode of one rank.

    A segment the Localizer calls slow has >= min_samples steps and its median speed below the
    cut, so at least ceil(min_samples / 2) steps below the cut: a rank with fewer is skipped
    before the (costly) change-point pass, with the same result."""
    cut = 1.0 - config.slow.threshold
    if np.sum(ref / own < cut) < max(1, -(-config.slow.min_samples // 2)):
        return []
    bounds = [0, *_change_points(steps, own / ref, config.change), steps.size]
    slow = [
        lo < hi and bool(_localizer(rank, own[lo:hi], ref[lo:hi], config.slow).localize())
        for lo, hi in zip(bounds, bounds[1:])
    ]
    out = []
    k = 0
    while k < len(slow):
        if not slow[k]:
            k += 1
            continue
        j = k
        while j + 1 < len(slow) and slow[j + 1]:
            j += 1
        lo, hi = bounds[k], bounds[j + 1]
        mask = np.zeros(steps.size, dtype=bool)
        mask[lo:hi] = True
        speed = _localizer(rank, own[lo:hi], ref[lo:hi], config.slow).speed_factors()[rank]
        out.append((int(steps[lo]), speed, mask))
        k = j + 1
    return out


def _imbalance(times: np.ndarray, dp: np.ndarray, stage: np.ndarray, threshold: float) -> list[dict]:
    stages, replicas = np.unique(stage), np.unique(dp)
    per = np.full((replicas.size, stages.size, times.shape[1]), np.nan)  # (replica, stage, step)
    for a, d in enumerate(replicas):
        for b, s in enumerate(stages):
            rows = (dp == d) & (stage == s)
            if rows.any():
                per[a, b] = _nanmedian(times[rows], axis=0)
    enough = np.sum(~np.isnan(per), axis=1) >= 2  # (replica, step): >= 2 stages to take a median of
    mid = np.where(enough, _nanmedian(per, axis=1), np.nan)
    ratio = _nanmedian(per / mid[:, None, :], axis=2)  # (replica, stage)
    out = []
    for b, s in enumerate(stages):
        r = ratio[:, b][~np.isnan(ratio[:, b])]
        if r.size and np.all(r > 1.0 + threshold):
            out.append({"stage": int(s), "ratio": round(float(np.median(r)), 3)})
    return out


def analyse_ops(trace: OpsTrace, config: OpsDetectConfig | None = None) -> OpsReport:
    """Fail-slow episodes per rank and imbalanced stages of `trace` (see the module docstring)."""
    config = config or OpsDetectConfig()
    ranks = sorted(trace.placement)
    steps = np.array(sorted({t for _, t in trace.compute_s}), dtype=np.int64)
    col = {int(t): k for k, t in enumerate(steps)}
    row = {r: k for k, r in enumerate(ranks)}
    times = np.full((len(ranks), steps.size), np.nan)
    for (r, t), c in trace.compute_s.items():
        if c > 0:  # a zero-length compute row measures nothing
            times[row[r], col[t]] = c
    dp = np.array([trace.placement[r][0] for r in ranks], dtype=np.int64)
    stage = np.array([trace.placement[r][1] for r in ranks], dtype=np.int64)
    ref = _references(times, dp, stage)
    fail_slow, unjudged = [], []
    healthy = times.copy()
    for i, r in enumerate(ranks):
        ok = ~np.isnan(times[i]) & ~np.isnan(ref[i]) & (ref[i] > 0)
        if not ok.any():
            unjudged.append(r)
            continue
        for first, speed, mask in _episodes(r, steps[ok], times[i][ok], ref[i][ok], config):
            fail_slow.append({"rank": r, "stage": int(stage[i]), "dp_rank": int(dp[i]),
                              "speed": round(speed, 3), "first_step": first})  # fmt: skip
            healthy[i, np.flatnonzero(ok)[mask]] = np.nan
    imbalance = _imbalance(healthy, dp, stage, config.imbalance)
    return OpsReport(len(ranks), int(steps.size), fail_slow, imbalance, unjudged)
