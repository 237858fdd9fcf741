"""Localization without pausing training: per-device speed and per-link bandwidth from residuals.

Inputs per iteration (the runtime's measurements, the MTP's predictions):
- per device: compute-only times of its compute instructions (F/B/W) and their predicted healthy
  times for the same micro-batches (so a long-sequence batch is *in* the prediction);
- per link (src, dst): measured and predicted transfer times (wire time, not time blocked on a
  slow peer).

Estimates: a device's speed factor p̂ = median(predicted/measured) over its instructions of the
last `window_iters` iterations; a link's bandwidth factor likewise. With `relative` (default) both
are divided by the median over all devices (links) when there are at least 3 — a global bias of the
predictor (clock drift, a stale calibration) then cancels, and only stragglers stand out.

Decisions: a device with factor < 1 − `threshold` is `fail-slow`; a link below it is `link-slow`,
unless one endpoint is itself slow and the link is not clearly slower than that device (its
transfers waited on the slow device). A long-sequence batch inflates measured and predicted times
alike, so its residuals stay ≈ 1 and nothing is blamed. Confidence = the share of the suspect's
recent samples that lie below 1 − threshold/2 (how consistently the samples agree).

If nothing stands out but the caller still wants an answer (an alarm was raised), `localize` calls
the optional `validate(iteration)` fallback — e.g. Greyhound's GEMM / P2P micro-benchmarks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .report import FailureReport

Timings = tuple[Sequence[float], Sequence[float]]  # (measured_s, predicted_s), same length


@dataclass(frozen=True)
class LocalizeConfig:
    window_iters: int = 2  # iterations of samples behind each estimate
    threshold: float = 0.10  # factor below 1 − threshold is suspect (Greyhound: > 10% off the median)
    min_samples: int = 3
    relative: bool = True  # divide by the median factor over devices (links) when >= 3 of them

    def __post_init__(self) -> None:
        if not isinstance(self.window_iters, int) or self.window_iters < 1:
            raise ValueError(f"localize.window_iters = {self.window_iters!r}: must be an integer >= 1")
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"localize.threshold = {self.threshold!r}: must lie in (0, 1)")
        if not isinstance(self.min_samples, int) or self.min_samples < 1:
            raise ValueError(f"localize.min_samples = {self.min_samples!r}: must be an integer >= 1")


_LINK_BASE = 1 << 32  # a link (lo, hi) is stored as lo * 2**32 + hi


def _check(what: str, ids: np.ndarray, measured: np.ndarray, predicted: np.ndarray) -> np.ndarray:
    if not (ids.shape == measured.shape == predicted.shape):
        raise ValueError(
            f"{what}: ids, measured and predicted need equal lengths, got "
            f"{ids.size}, {measured.size}, {predicted.size}"
        )
    bad = np.flatnonzero(~((measured > 0) & (predicted > 0)))
    if bad.size:
        raise ValueError(f"{what} {ids[bad[0]]}: times must be > 0")
    return predicted / measured


def _flatten(timings: Mapping) -> tuple[list, np.ndarray, np.ndarray, np.ndarray]:
    keys = list(timings)
    meas = [np.asarray(timings[k][0], dtype=np.float64).ravel() for k in keys]
    pred = [np.asarray(timings[k][1], dtype=np.float64).ravel() for k in keys]
    for k, m, p in zip(keys, meas, pred):
        if m.size != p.size:
            raise ValueError(f"{k!r}: {m.size} measured vs {p.size} predicted times")
    sizes = np.array([m.size for m in meas], dtype=np.int64)
    if not keys:
        return keys, sizes, np.zeros(0), np.zeros(0)
    return keys, sizes, np.concatenate(meas), np.concatenate(pred)


class _Groups:
    """Grouped robust statistics of (id, ratio) samples, vectorised (one sort)."""

    def __init__(self, ids: np.ndarray, ratios: np.ndarray, config: LocalizeConfig) -> None:
        self.ids, inv, self.counts = np.unique(ids, return_inverse=True, return_counts=True)
        # One float sort orders by group, then by ratio: ratio/(1 + ratio) lies in (0, 1).
        r = ratios[np.argsort(inv + ratios / (1.0 + ratios))]
        start = np.cumsum(self.counts) - self.counts
        med = 0.5 * (r[start + (self.counts - 1) // 2] + r[start + self.counts // 2])
        ref = float(np.median(med)) if config.relative and med.size >= 3 else 1.0
        self.factors = med / ref
        below = (r / ref < 1.0 - config.threshold / 2).astype(np.int64)
        self.confidence = (np.add.reduceat(below, start) / self.counts) if r.size else med


class Localizer:
    """Keeps recent residuals per device and link; `localize` turns them into `FailureReport`s."""

    def __init__(
        self,
        config: LocalizeConfig | None = None,
        validate: Callable[[int], Sequence[FailureReport]] | None = None,
    ) -> None:
        self.config = config or LocalizeConfig()
        self.validate = validate
        n = self.config.window_iters
        self._dev: deque[tuple[np.ndarray, np.ndarray]] = deque(maxlen=n)  # (ids, ratios)
        self._link: deque[tuple[np.ndarray, np.ndarray]] = deque(maxlen=n)
        self.iteration = -1

    def observe(
        self,
        iteration: int,
        compute: Mapping[int, Timings],
        links: Mapping[tuple[int, int], Timings] | None = None,
    ) -> None:
        """Record one iteration: `compute[device] = (measured_s, predicted_s)`, likewise `links`."""
        keys, sizes, meas, pred = _flatten(compute)
        dev = np.repeat(np.asarray(keys, dtype=np.int64), sizes)
        lkeys, lsizes, lmeas, lpred = _flatten(links or {})
        pairs = np.asarray(lkeys, dtype=np.int64).reshape(-1, 2)
        self.observe_arrays(iteration, dev, meas, pred, np.repeat(pairs, lsizes, axis=0), lmeas, lpred)

    def observe_arrays(
        self,
        iteration: int,
        devices,
        measured,
        predicted,
        links=None,
        link_measured=None,
        link_predicted=None,
    ) -> None:
        """Flat form of `observe`: one row per instruction (device id) and per transfer (src, dst)."""
        dev = np.asarray(devices, dtype=np.int64).ravel()
        r = _check(
            "device", dev, np.asarray(measured, np.float64).ravel(), np.asarray(predicted, np.float64).ravel()
        )
        pairs = np.asarray(links if links is not None else np.zeros((0, 2)), dtype=np.int64).reshape(-1, 2)
        lkey = np.minimum(pairs[:, 0], pairs[:, 1]) * _LINK_BASE + np.maximum(pairs[:, 0], pairs[:, 1])
        lm = np.asarray(link_measured if link_measured is not None else [], np.float64).ravel()
        lp = np.asarray(link_predicted if link_predicted is not None else [], np.float64).ravel()
        lr = _check("link", lkey, lm, lp)
        self._dev.append((dev, r))
        self._link.append((lkey, lr))
        self.iteration = iteration

    def forget(self, devices: Sequence[int] = ()) -> None:
        """Drop history (all of it, or of these devices and their links) after a plan change."""
        if not len(devices):
            self._dev.clear()
            self._link.clear()
            return
        gone = np.asarray(devices, dtype=np.int64)
        self._dev = deque(
            ((i[~np.isin(i, gone)], r[~np.isin(i, gone)]) for i, r in self._dev), maxlen=self._dev.maxlen
        )
        keep = [~(np.isin(i // _LINK_BASE, gone) | np.isin(i % _LINK_BASE, gone)) for i, _ in self._link]
        self._link = deque(((i[k], r[k]) for (i, r), k in zip(self._link, keep)), maxlen=self._link.maxlen)

    def _groups(self, store: deque) -> _Groups:
        ids = np.concatenate([i for i, _ in store]) if store else np.zeros(0, np.int64)
        r = np.concatenate([r for _, r in store]) if store else np.zeros(0)
        return _Groups(ids, r, self.config)

    def speed_factors(self) -> dict[int, float]:
        """Estimated speed factor per device (1 = as predicted / as fast as its peers)."""
        g = self._groups(self._dev)
        return dict(zip(g.ids.tolist(), g.factors.tolist()))

    def link_factors(self) -> dict[tuple[int, int], float]:
        g = self._groups(self._link)
        return {(k // _LINK_BASE, k % _LINK_BASE): f for k, f in zip(g.ids.tolist(), g.factors.tolist())}

    def localize(self, iteration: int | None = None) -> list[FailureReport]:
        """Suspects, worst first; falls back to `validate` when there are none and it is set."""
        it = self.iteration if iteration is None else iteration
        c = self.config
        cut = 1.0 - c.threshold
        out: list[FailureReport] = []
        g = self._groups(self._dev)
        slow: dict[int, float] = {}
        for k in np.flatnonzero((g.factors < cut) & (g.counts >= c.min_samples)):
            d, f = int(g.ids[k]), float(g.factors[k])
            slow[d] = f
            out.append(
                FailureReport(
                    "fail-slow", (d,), severity=min(f, 1.0), confidence=float(g.confidence[k]), iteration=it
                )
            )
        g = self._groups(self._link)
        for k in np.flatnonzero((g.factors < cut) & (g.counts >= c.min_samples)):
            key = (int(g.ids[k]) // _LINK_BASE, int(g.ids[k]) % _LINK_BASE)
            f = float(g.factors[k])
            slow_end = min((slow[d] for d in key if d in slow), default=None)
            if slow_end is not None and f >= slow_end * cut:
                continue  # the transfers waited on a slow endpoint
            out.append(
                FailureReport(
                    "link-slow",
                    key,
                    key,
                    severity=min(f, 1.0),
                    confidence=float(g.confidence[k]),
                    iteration=it,
                )
            )
        if not out and self.validate is not None:
            return list(self.validate(it))
        return sorted(out, key=lambda r: (r.severity, r.kind, r.devices))
