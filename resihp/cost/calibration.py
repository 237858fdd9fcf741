"""Micro-batch time predictor (MTP): fit `T ≈ c0 + alpha·N + beta·Σl²` from measured chunks.

ResiHP eq. (1) without the intercept; `c0` absorbs fixed per-chunk costs (kernel launches, a
P2P hand-off measured inside the chunk) and can be forced to 0. One fit per key, e.g. (stage,
chunk kind F/B/W); the pipeline simulator takes exactly these (c0, alpha, beta) rows.

Noise on measured times is multiplicative, so the fit minimises *relative* residuals
`(T̂ − T)/T`. Robustness: iteratively reweighted least squares with Huber weights (scale from the
MAD), then one refit without the points beyond `reject_sigma` robust sigmas, so a few gross
outliers (a GC pause, a preempted kernel) do not move the coefficients.

Identifiability: with packed micro-batches every sample has the same N (= seq_len), so `c0` and
`alpha·N` cannot be told apart. Then the fit puts the whole constant into `alpha` (`c0 = 0`,
`alpha = constant / N`): per-token cost is the physical term and keeps the right scale if the key
is reused at a nearby N. Likewise a constant Σl² (fixed-length documents) gives `beta = 0` with its
share folded into the constant term (into `alpha` when there is none). Both cases reproduce the
fitted samples as well as the full model would; only the split between coefficients is a choice.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass

import numpy as np

from resihp.core.costs import linear_time

_HUBER_K = 1.345  # 95% efficiency under Gaussian noise
_MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class LinearTime:
    """Chunk time in seconds: `c0 + alpha·n + beta·sum_sq` (n tokens, sum_sq = Σ segment²)."""

    c0: float
    alpha: float
    beta: float

    def predict(self, n, sum_sq):
        """Vectorised prediction; scalars in give a float out."""
        out = linear_time(
            self.c0,
            self.alpha,
            self.beta,
            np.asarray(n, dtype=np.float64),
            np.asarray(sum_sq, dtype=np.float64),
        )
        return float(out) if out.ndim == 0 else out

    def as_row(self) -> tuple[float, float, float]:
        return (self.c0, self.alpha, self.beta)


def chunk_table(f: LinearTime, b: LinearTime, w: LinearTime | None = None) -> np.ndarray:
    """(3, 3) rows F, B, W × columns (c0, alpha, beta): one group's entry of `Costs.chunk`.
    A missing W (schedules that fold it into B) is a zero row."""
    rows = [f.as_row(), b.as_row(), w.as_row() if w is not None else (0.0, 0.0, 0.0)]
    return np.array(rows, dtype=np.float64)


def mape(predicted, actual) -> float:
    """Mean absolute percentage error, in percent."""
    p = np.asarray(predicted, dtype=np.float64)
    a = np.asarray(actual, dtype=np.float64)
    if p.shape != a.shape or a.size == 0:
        raise ValueError(f"mape: need equal non-empty shapes, got {p.shape} and {a.shape}")
    return float(np.mean(np.abs(p - a) / np.abs(a)) * 100.0)


def _is_constant(x: np.ndarray) -> bool:
    return bool(np.ptp(x) <= 1e-9 * max(float(np.max(np.abs(x))), 1e-300))


def _wls(cols: np.ndarray, t: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted least squares on relative residuals; columns are scaled for conditioning."""
    scale = np.max(np.abs(cols), axis=0)
    scale[scale == 0] = 1.0
    a = cols / scale / t[:, None] * np.sqrt(w)[:, None]
    b = np.sqrt(w)
    coef, *_ = np.linalg.lstsq(a, b, rcond=None)
    return coef / scale


def _robust_sigma(r: np.ndarray) -> float:
    med = np.median(r)
    s = _MAD_TO_SIGMA * float(np.median(np.abs(r - med)))
    if s == 0.0:
        s = float(np.mean(np.abs(r - med))) * 1.2533  # mean-abs-dev fallback; 0 on an exact fit
    return s


def fit_linear_time(
    n, sum_sq, t, *, intercept: bool = True, iterations: int = 20, reject_sigma: float = 4.0
) -> LinearTime:
    """Robust fit of `t ≈ c0 + alpha·n + beta·sum_sq` over samples (see the module docstring).

    `intercept=False` forces `c0 = 0`. Raises `ValueError` on mismatched shapes, non-positive
    times, or fewer samples than free coefficients.
    """
    n = np.asarray(n, dtype=np.float64).ravel()
    s = np.asarray(sum_sq, dtype=np.float64).ravel()
    t = np.asarray(t, dtype=np.float64).ravel()
    if not (n.shape == s.shape == t.shape) or t.size == 0:
        raise ValueError(
            f"fit_linear_time: n, sum_sq, t need equal non-empty lengths, got {n.size}, {s.size}, {t.size}"
        )
    if np.any(~np.isfinite(t)) or np.any(t <= 0):
        raise ValueError("fit_linear_time: times must be finite and > 0")
    if np.any(n <= 0) or np.any(s < 0):
        raise ValueError("fit_linear_time: token counts n must be > 0 and sum_sq >= 0")
    n_const, s_const = _is_constant(n), _is_constant(s)
    # Identifiable columns; a constant column is folded into the constant term (docstring).
    names: list[str] = []
    if intercept and not n_const:
        names.append("c0")
    names.append("alpha")  # always present: carries the constant when N is constant
    if not s_const:
        names.append("beta")
    cols_by = {"c0": np.ones_like(n), "alpha": n, "beta": s}
    cols = np.stack([cols_by[k] for k in names], axis=1)
    if t.size < len(names):
        raise ValueError(f"fit_linear_time: {t.size} samples for {len(names)} coefficients")
    w = np.ones_like(t)
    coef = _wls(cols, t, w)
    for _ in range(iterations):
        r = cols @ coef / t - 1.0
        sigma = _robust_sigma(r)
        if sigma == 0.0:
            break
        a = np.abs(r - np.median(r))
        w_new = np.minimum(1.0, _HUBER_K * sigma / np.maximum(a, 1e-300))
        coef_new = _wls(cols, t, w_new)
        done = np.allclose(coef_new, coef, rtol=1e-10, atol=0.0)
        coef, w = coef_new, w_new
        if done:
            break
    r = cols @ coef / t - 1.0
    sigma = _robust_sigma(r)
    keep = np.abs(r - np.median(r)) <= reject_sigma * sigma if sigma > 0 else np.ones_like(t, bool)
    if len(names) <= keep.sum() < t.size:
        coef = _wls(cols[keep], t[keep], np.ones(int(keep.sum())))
    got = dict(zip(names, (float(c) for c in coef)))
    return LinearTime(got.get("c0", 0.0), got["alpha"], got.get("beta", 0.0))


def fit_linear_times(
    samples: Iterable[tuple[Hashable, float, float, float]], *, intercept: bool = True
) -> dict[Hashable, LinearTime]:
    """One `fit_linear_time` per key over `(key, n, sum_sq, t)` samples, e.g. key = (stage, "F")."""
    groups: dict[Hashable, list[tuple[float, float, float]]] = {}
    for key, n, s, t in samples:
        groups.setdefault(key, []).append((n, s, t))
    out = {}
    for key, rows in groups.items():
        arr = np.asarray(rows, dtype=np.float64)
        try:
            out[key] = fit_linear_time(arr[:, 0], arr[:, 1], arr[:, 2], intercept=intercept)
        except ValueError as e:
            raise ValueError(f"calibration key {key!r}: {e}") from None
    return out
