"""Bayesian online change-point detection (Adams & MacKay 2007), Normal model, numpy only.

Observations are Normal with unknown mean and variance under a Normal-Gamma prior
(mu0, kappa0, alpha0, beta0); the posterior predictive of each run is a Student-t. The hazard is
constant. Everything is kept in log space.

Convention: the run length `r_t` counts the points of the current run *including* x_t, so
`r_t = 1` means "x_t is the first point of a new run". With a constant hazard H the mass on
`r_t = 0` ("the next point starts a run") is exactly H, so Greyhound's literal rule
"P(r_t = 0) > 0.9" never fires. What this module thresholds instead is

    change_probability(window) = P(r_t < window | x_1..x_t),

the posterior probability that a new run started at one of the last `window − 1` points. With
`window = 2` this is P(x_t starts a new run), the literal rule in the other common convention; a
larger window (default 10) lets a shift that needs a few points of evidence cross the threshold.
The estimated change point is `t − r* + 1` with `r* = argmax_{r < window} P(r_t = r)`.

Run-length truncation keeps O(max_run) work per update: the two longest run lengths are merged
(probabilities added, the longer run's statistics kept), so the last bin means "≥ max_run".

The state is a tuple of arrays that `update` never mutates in place, so `state()`/`restore()` is a
zero-copy snapshot; the change-point stage uses it to remove points from the series.
"""

from __future__ import annotations

import math

import numpy as np


def _logsumexp(a: np.ndarray) -> float:
    m = float(np.max(a))
    if not math.isfinite(m):
        return m
    return m + math.log(float(np.sum(np.exp(a - m))))


def _lgamma_half_ratio(a: np.ndarray) -> np.ndarray:
    """log Γ(a + ½) − log Γ(a): exact below 8, asymptotic series above (error < 1e-9)."""
    out = 0.5 * np.log(a) - 1.0 / (8.0 * a) + 1.0 / (192.0 * a**3) - 1.0 / (640.0 * a**5)
    for i in np.flatnonzero(a < 8.0):
        out[i] = math.lgamma(a[i] + 0.5) - math.lgamma(a[i])
    return out


class BOCPD:
    """Online run-length posterior for a univariate series; one `update` per observation."""

    def __init__(
        self,
        hazard: float = 1.0 / 250.0,
        mu0: float | None = None,
        kappa0: float = 0.01,
        alpha0: float = 1.0,
        beta0: float = 0.05**2,
        max_run: int = 300,
    ) -> None:
        if not 0.0 < hazard < 1.0:
            raise ValueError(f"bocpd.hazard = {hazard!r}: must lie in (0, 1)")
        if kappa0 <= 0 or alpha0 <= 0 or beta0 <= 0:
            raise ValueError(
                f"bocpd priors kappa0={kappa0!r}, alpha0={alpha0!r}, beta0={beta0!r}: must be > 0"
            )
        if not isinstance(max_run, int) or max_run < 2:
            raise ValueError(f"bocpd.max_run = {max_run!r}: must be an integer >= 2")
        self.hazard = hazard
        self.mu0 = mu0  # None: the first observation
        self.kappa0, self.alpha0, self.beta0 = kappa0, alpha0, beta0
        self.max_run = max_run
        self.t = 0
        # log P(r_t = r) for r = 0..len-1 and the posterior parameters of each run length.
        self._log_r = np.zeros(1)
        self._params: tuple[np.ndarray, ...] | None = None

    # --- snapshots ---
    def state(self) -> tuple:
        return (self.t, self._log_r, self._params, self.mu0)

    def restore(self, state: tuple) -> None:
        self.t, self._log_r, self._params, self.mu0 = state

    # --- the update ---
    def _prior(self) -> tuple[np.ndarray, ...]:
        return (
            np.array([self.mu0]),
            np.array([self.kappa0]),
            np.array([self.alpha0]),
            np.array([self.beta0]),
        )

    def update(self, x: float) -> float:
        """Absorb one observation; return `change_probability()` with the default window."""
        x = float(x)
        if not math.isfinite(x):
            raise ValueError(f"bocpd.update: observation {x!r} is not finite")
        if self.mu0 is None:
            self.mu0 = x
        if self._params is None:
            self._params = self._prior()
        mu, kappa, alpha, beta = self._params
        # Student-t predictive of x under each run length r_{t-1}.
        df = 2.0 * alpha
        scale2 = beta * (kappa + 1.0) / (alpha * kappa)
        z2 = (x - mu) ** 2 / scale2
        log_pred = (
            _lgamma_half_ratio(alpha) - 0.5 * np.log(np.pi * df * scale2) - (alpha + 0.5) * np.log1p(z2 / df)
        )
        joint = self._log_r + log_pred
        log_r = np.empty(joint.size + 1)
        log_r[0] = math.log(self.hazard) + _logsumexp(joint)
        log_r[1:] = math.log1p(-self.hazard) + joint
        log_r -= _logsumexp(log_r)
        # Posterior parameters after x for every grown run; r = 0 restarts from the prior.
        p_mu, p_kappa, p_alpha, p_beta = self._prior()
        new_mu = np.concatenate([p_mu, (kappa * mu + x) / (kappa + 1.0)])
        new_kappa = np.concatenate([p_kappa, kappa + 1.0])
        new_alpha = np.concatenate([p_alpha, alpha + 0.5])
        new_beta = np.concatenate([p_beta, beta + kappa * (x - mu) ** 2 / (2.0 * (kappa + 1.0))])
        params = [new_mu, new_kappa, new_alpha, new_beta]
        while log_r.size > self.max_run:  # merge the two longest run lengths into ">= max_run"
            merged = np.logaddexp(log_r[-2], log_r[-1])
            log_r = np.concatenate([log_r[:-2], [merged]])
            params = [np.concatenate([p[:-2], p[-1:]]) for p in params]
        self._log_r = log_r
        self._params = tuple(params)
        self.t += 1
        return self.change_probability()

    # --- read-outs ---
    def run_length_posterior(self) -> np.ndarray:
        """P(r_t = r) for r = 0..len-1 (the last bin means >= max_run once truncation starts)."""
        return np.exp(self._log_r)

    @property
    def map_run_length(self) -> int:
        return int(np.argmax(self._log_r))

    def change_probability(self, window: int = 10) -> float:
        """P(r_t < window): a new run started at one of the last `window − 1` points."""
        return float(np.exp(_logsumexp(self._log_r[:window])))

    def change_index(self, window: int = 10) -> int:
        """0-based index of the most likely recent change: `t − r* + 1`, r* the MAP of r < window."""
        head = self._log_r[:window]
        r = int(np.argmax(head[1:])) + 1 if head.size > 1 else 1
        return self.t - r
