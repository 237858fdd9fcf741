"""Synthetic timing traces for the detector benchmark, deliberately *not* in the MTP's form.

The predictor assumes `c0 + alpha·N + beta·Σl²`. The "true" chunk time here is instead

    per_token_s·N  +  Σ_segments att_s·l² / eff(l)  +  doc_overhead_s·(#segments)

with an attention-kernel efficiency `eff(l) = 1 − eff_drop·exp(−l / eff_len)` (short segments run
the kernel less efficiently), a per-document overhead (mask / varlen index set-up), then
multiplicative lognormal jitter per chunk and per iteration, a slow diurnal drift, rare spikes
(a GC pause, a preempted kernel) and additive measurement noise. A fail-slow divides the chunk
times of one stage by its speed factor from `at_iter` on.

Iteration time from chunk times goes through a seam, `iteration_time(chunk_s) -> seconds`, where
`chunk_s[s, j]` is (forward, backward) of micro-batch j on stage s. The default is an exact GPipe
DAG (`gpipe_iteration_s`); the benchmark will pass an adapter around `resihp.evaluator.pipeline`
evaluating the real compiled Program so that prediction and truth share the schedule (only the
chunk-cost form differs). Deterministic: everything is drawn from `seed`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from resihp.core.workload import Workload

IterationTime = Callable[[np.ndarray], float]  # chunk_s: (pp, m, 2) F and B seconds -> iteration s


def gpipe_iteration_s(chunk_s: np.ndarray) -> float:
    """Critical path of GPipe: all forwards (stage s waits for s−1 and for its own previous chunk),
    then all backwards in reverse stage order. P2P time is zero."""
    pp, m, _ = chunk_s.shape
    f_end = np.zeros((pp + 1, m + 1))
    for s in range(pp):
        for j in range(m):
            f_end[s + 1, j + 1] = max(f_end[s, j + 1], f_end[s + 1, j]) + chunk_s[s, j, 0]
    b_end = np.zeros((pp + 1, m + 1))
    b_end[pp, :] = f_end[pp, m]
    for s in reversed(range(pp)):
        b_end[s, 0] = max(b_end[s, 0], f_end[s + 1, m])
        for j in range(m):
            b_end[s, j + 1] = max(b_end[s + 1, j + 1], b_end[s, j]) + chunk_s[s, j, 1]
    return float(b_end[0, m])


@dataclass(frozen=True)
class SynthConfig:
    seq_len: int = 8192
    num_microbatches: int = 8
    pp: int = 4
    lengths: str = "github"
    seed: int = 0
    per_token_s: float = 2e-6  # forward, per stage
    att_s: float = 1e-10  # forward, per squared token at full kernel efficiency
    eff_drop: float = 0.6
    eff_len: float = 1024.0
    doc_overhead_s: float = 30e-6
    backward_ratio: float = 2.0
    chunk_jitter: float = 0.01  # lognormal sigma per chunk
    iter_jitter: float = 0.01  # lognormal sigma shared by one iteration's chunks
    diurnal_amp: float = 0.015
    diurnal_period: int = 720  # iterations
    spike_prob: float = 0.005  # per iteration
    spike_range: tuple[float, float] = (1.3, 2.5)
    measure_sigma_s: float = 1e-4  # additive noise on each measured time
    slow: dict[int, tuple[int, float]] = field(default_factory=dict)  # stage -> (at_iter, speed)

    def __post_init__(self) -> None:
        if not isinstance(self.pp, int) or self.pp < 1:
            raise ValueError(f"synth.pp = {self.pp!r}: must be an integer >= 1")
        for s, (at, p) in self.slow.items():
            if not (0 <= s < self.pp and at >= 0 and 0.0 < p <= 1.0):
                raise ValueError(f"synth.slow[{s}] = {(at, p)!r}: need stage < pp, at >= 0, 0 < p <= 1")


@dataclass(frozen=True)
class TraceIteration:
    iteration: int
    n: np.ndarray  # (m,) tokens per micro-batch
    sum_sq: np.ndarray  # (m,) Σ segment² per micro-batch
    lengths: tuple[tuple[int, ...], ...]  # segment lengths per micro-batch
    chunk_s: np.ndarray  # (pp, m, 2) measured forward/backward compute time per stage
    observed_s: float  # measured iteration time


def true_forward_s(cfg: SynthConfig, n: int, segments: np.ndarray) -> float:
    """Noise-free forward time of one micro-batch on one healthy stage (the non-MTP form)."""
    seg = segments.astype(np.float64)
    eff = 1.0 - cfg.eff_drop * np.exp(-seg / cfg.eff_len)
    return cfg.per_token_s * n + float(np.sum(cfg.att_s * seg**2 / eff)) + cfg.doc_overhead_s * seg.size


def synthesize(
    cfg: SynthConfig, iterations: int, iteration_time: IterationTime = gpipe_iteration_s
) -> list[TraceIteration]:
    """`iterations` iterations of one pipeline replica; see the module docstring."""
    workload = Workload(cfg.seq_len, cfg.num_microbatches, cfg.lengths, cfg.seed)
    rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, 7]))
    m, pp = cfg.num_microbatches, cfg.pp
    out = []
    for it in range(iterations):
        batch = workload.pack(it, m)
        lens = tuple(tuple(batch.lengths(j)) for j in range(m))
        base = np.array([true_forward_s(cfg, cfg.seq_len, np.array(lens[j])) for j in range(m)])
        chunk = np.empty((pp, m, 2))
        chunk[:, :, 0] = base
        chunk[:, :, 1] = base * cfg.backward_ratio
        drift = 1.0 + cfg.diurnal_amp * np.sin(2 * np.pi * it / cfg.diurnal_period)
        chunk *= drift * np.exp(cfg.iter_jitter * rng.standard_normal())
        chunk *= np.exp(cfg.chunk_jitter * rng.standard_normal(chunk.shape))
        for s, (at, p) in cfg.slow.items():
            if it >= at:
                chunk[s] /= p
        observed = iteration_time(chunk)
        if rng.random() < cfg.spike_prob:
            observed *= rng.uniform(*cfg.spike_range)
        chunk = np.maximum(chunk + cfg.measure_sigma_s * rng.standard_normal(chunk.shape), 1e-6)
        observed = max(observed + cfg.measure_sigma_s * rng.standard_normal(), 1e-6)
        out.append(
            TraceIteration(it, np.full(m, cfg.seq_len), batch.sum_sq.copy(), lens, chunk, float(observed))
        )
    return out
