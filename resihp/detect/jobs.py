"""Batched synthetic timing traces of short jobs for the detector benchmark (one Plan per setting).

Truth, deliberately *not* the MTP's form (as in `synth`): a chunk of stage s, kind k (F/B/W) on a
micro-batch with segments l_i takes

    c0 + alpha·N + beta·Σ l_i²/eff(l_i) + overhead_k·#segments,   eff(l) = 1 − 0.6·exp(−l/1024)

with (c0, alpha, beta) from the analytical cost model (`build_costs`) on the healthy cluster. Each
TP rank's *compute-only* time gets its own lognormal jitter (1%) on top of an iteration-wide jitter
(1%) and a slow drift; a TP group's chunk lasts as long as its slowest rank. A P2P transfer between
stages is split over the TP rank pairs (ResiHP §7): each pair's piece takes α + bytes/bandwidth with
4% jitter, the transfer lasts as long as its slowest piece. The iteration time is the pipeline DAG
(`itp.BatchDag`, the same graph `evaluate` walks) over those durations, transfers and blocking sends,
plus the optimizer step, then rare spikes (0.5% of iterations, ×1.3–2.5) and measurement noise.

Faults: a device at speed p divides its compute times by p from the onset iteration on; a link (one
TP rank pair between adjacent stages) at bandwidth factor f divides its pieces' wire time by f.

Micro-batches come from a pool of packed iterations (`Workload.pack`, seeded), drawn independently
per job iteration, except in *bursts*: with probability `burst_prob` per iteration a run of 3–15
consecutive iterations draws only from the 10% of micro-batches with the largest Σl² (a very long
document, or a data source switch, spans consecutive iterations). Bursts are what makes a
length-blind change-point detector raise persistent false alarms; `burst_prob = 0` gives
independent lengths.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from resihp.core.cluster import Cluster
from resihp.core.model_spec import model_preset
from resihp.core.plan import Plan
from resihp.core.program import compile_plan
from resihp.core.workload import Workload
from resihp.cost import build_costs
from resihp.cost.comm import Links
from resihp.cost.hardware import hardware_preset

from .itp import BatchDag

# seq_len -> (model, tp, pp, microbatches, schedule): the paper's Table 4 rows, one replica.
LAYOUTS = {
    8192: ("qwen2.5-7b", 4, 2, 4, "1f1b"),
    16384: ("qwen2.5-14b", 4, 4, 8, "zbh1"),
    32768: ("llama2-13b", 4, 4, 8, "1f1b"),
}
EFF_DROP, EFF_LEN = 0.6, 1024.0
DOC_OVERHEAD_S = (30e-6, 45e-6, 15e-6)  # F, B, W per segment
CHUNK_JITTER, ITER_JITTER, XFER_JITTER = 0.01, 0.01, 0.04
DRIFT_AMP, DRIFT_PERIOD = 0.015, 720
SPIKE_PROB, SPIKE_RANGE = 0.005, (1.3, 2.5)
BURST_ITERS = (3, 15)  # a long-document burst lasts this many consecutive iterations (uniform)
LONG_QUANTILE = 0.9  # burst micro-batches come from the top 10% of the pool by Σl²
MEASURE_SIGMA_S = 1e-5


@dataclass
class Block:
    """J jobs × T iterations. Device times are (J, T, pp, tp, 3, m); transfers (J, T, 2, pp−1, m, tp)."""

    device_s: np.ndarray  # compute-only time of each rank's F/B/W chunk of each micro-batch
    sum_sq: np.ndarray  # (J, T, m) true Σl² of each micro-batch (what the packer logs)
    piece_s: np.ndarray  # wire time of each rank pair's piece of each transfer
    observed_s: np.ndarray  # (J, T) measured iteration time


class JobModel:
    """One setting's Plan, cost tables, transfer times and micro-batch pool."""

    def __init__(
        self,
        seq_len: int,
        lengths: str,
        pool_seed: int = 0,
        pool_iters: int = 600,
        burst_prob: float = 0.0,
        layout: tuple | None = None,
        cluster: Cluster | None = None,
        pool_count: int | None = None,
    ) -> None:
        """`layout` = (model, tp, pp, microbatches, schedule) overrides `LAYOUTS[seq_len]`; `cluster`
        the default of one node per stage (every PP link inter-node); the pool packs `pool_count`
        (default: microbatches) micro-batches per iteration."""
        if layout is None and seq_len not in LAYOUTS:
            raise ValueError(f"bench seq_len = {seq_len}: allowed: {', '.join(map(str, LAYOUTS))}")
        name, tp, pp, m, schedule = layout or LAYOUTS[seq_len]
        self.seq_len, self.lengths, self.tp, self.pp, self.m = seq_len, lengths, tp, pp, m
        model = model_preset(name) if isinstance(name, str) else name
        self.cluster = cluster or Cluster(pp, tp, "a100-80g")
        self.plan = Plan.uniform(model, tp, pp, 1, m, schedule)
        self.dag = BatchDag(compile_plan(self.plan))
        wl = Workload(seq_len, m, lengths, pool_seed)
        sq, qe, ns = [], [], []
        for it in range(pool_iters):
            b = wl.pack(it, pool_count or m)
            seg = b.seg_len.astype(np.float64)
            eff = 1.0 - EFF_DROP * np.exp(-seg / EFF_LEN)
            sq.append(b.sum_sq)
            qe.append(np.bincount(b.seg_window, weights=seg**2 / eff, minlength=b.count))
            ns.append(np.bincount(b.seg_window, minlength=b.count).astype(np.float64))
        self.pool = np.stack([np.concatenate(sq), np.concatenate(qe), np.concatenate(ns)])  # (3, P)
        self.long = np.flatnonzero(self.pool[0] >= np.quantile(self.pool[0], LONG_QUANTILE))
        self.burst_prob = burst_prob
        costs = build_costs(model, self.plan, self.cluster, np.full(m, float(seq_len)), self.pool[0, :m])
        self.table = np.stack([costs.chunk[(0, i)] for i in range(pp)])  # (pp, 3 kinds, 3 coeffs)
        self.step_s = costs.step_s
        # Piece wire time per (boundary, rank pair) and its latency; activation = gradient size.
        hw = hardware_preset(self.cluster.gpu)
        links = Links(self.cluster, hw)
        piece_bytes = seq_len * model.hidden * 2.0 / tp
        self.devices = np.array([self.plan.replicas[0][i].devices for i in range(pp)])  # (pp, tp)
        a, b = self.devices[:-1], self.devices[1:]
        self.piece_alpha = np.vectorize(links.alpha)(a, b)  # (pp−1, tp)
        self.piece_wire = piece_bytes / links.bw_pairs(a, b)

    # --- noise-free pieces for calibrating severities ---
    def _chunk_base(self, idx: np.ndarray) -> np.ndarray:
        """(..., pp, 3, m) noise-free chunk time of pool micro-batches `idx` (..., m)."""
        _, qe, ns = (self.pool[k][idx] for k in range(3))
        t = self.table  # (pp, 3, 3)
        ovh = np.array(DOC_OVERHEAD_S)[:, None]
        return (
            t[:, :, 0, None] + t[:, :, 1, None] * self.seq_len
            + t[:, :, 2, None] * qe[..., None, None, :] + ovh * ns[..., None, None, :]
        )  # fmt: skip

    def iteration_s(self, group_s: np.ndarray, xfer_s: np.ndarray) -> np.ndarray:
        """DAG iteration time; group_s (..., pp, 3, m), xfer_s (..., 2, pp−1, m)."""
        flat = xfer_s.reshape(*xfer_s.shape[:-3], -1)
        if flat.shape[-1] == 0:  # one stage: no transfers
            flat = np.zeros((*flat.shape[:-1], 1))
        dur, edge, send = {}, {}, {}
        for g in self.dag.groups:
            kind, mb = self.dag.kind[g], self.dag.mb[g]
            dur[g] = group_s[..., g[1], kind, mb]
            for out, ix in ((edge, self.dag.in_xfer[g]), (send, self.dag.out_xfer[g])):
                out[g] = np.where(ix >= 0, flat[..., np.maximum(ix, 0)], 0.0)
        return self.dag.iteration_s(dur, edge, send, tail_s=self.step_s)

    def slowdown(self, speed: float = 1.0, stage: int = 0, link_factor: float = 1.0, boundary: int = 0,
                 samples: int = 64) -> float:  # fmt: skip
        """Mean noise-free iteration-time ratio (faulty / healthy) over pool batches."""
        idx = np.arange(samples * self.m).reshape(samples, self.m) % self.pool.shape[1]
        base = self._chunk_base(idx)
        shape = (2, self.pp - 1, self.m)
        xfer = (self.piece_alpha + self.piece_wire).max(-1)[:, None]
        healthy = self.iteration_s(base, np.broadcast_to(xfer, shape))
        slow = base.copy()
        slow[:, stage] /= speed
        wire = self.piece_wire.copy()
        wire[boundary] /= link_factor
        xf = np.broadcast_to((self.piece_alpha + wire).max(-1)[:, None], shape)
        return float(np.mean(self.iteration_s(slow, xf) / healthy))

    def severity_for(self, ratio: float, kind: str, where: int) -> float:
        """Speed (kind "slow", stage `where`) or bandwidth factor (kind "link", boundary `where`)
        giving a mean iteration-time ratio `ratio` (bisection in log space; clamped to 1e-3)."""

        def f(x: float) -> float:
            if kind == "slow":
                return self.slowdown(speed=x, stage=where)
            return self.slowdown(link_factor=x, boundary=where)

        lo, hi = 1e-3, 1.0
        if f(lo) < ratio:
            return lo
        for _ in range(40):
            mid = float(np.sqrt(lo * hi))
            lo, hi = (mid, hi) if f(mid) >= ratio else (lo, mid)
        return float(np.sqrt(lo * hi))

    # --- one block of jobs ---
    def block(
        self, rng: np.random.Generator, jobs: int, iters: int, faults: list, idx: np.ndarray | None = None
    ) -> Block:
        """`faults[j]`: a list of (or one, or None) ("slow", onset, stage, tp_rank, p[, end]) /
        ("link", onset, boundary, tp_rank, f[, end]); `idx` (J, T, m) fixes the pool micro-batches."""
        m, pp, tp = self.m, self.pp, self.tp
        drawn = rng.integers(0, self.pool.shape[1], size=(jobs, iters, m))
        idx = drawn if idx is None else idx
        starts = np.argwhere(rng.random((jobs, iters)) < self.burst_prob)
        burst = np.zeros((jobs, iters), dtype=bool)
        for (j, t), n in zip(starts, rng.integers(BURST_ITERS[0], BURST_ITERS[1] + 1, len(starts))):
            burst[j, t : t + n] = True
        idx = np.where(burst[..., None], self.long[rng.integers(0, self.long.size, idx.shape)], idx)
        base = self._chunk_base(idx)  # (J, T, pp, 3, m)
        t = np.arange(iters)
        phase = rng.integers(0, DRIFT_PERIOD, (jobs, 1))
        drift = 1.0 + DRIFT_AMP * np.sin(2 * np.pi * (t + phase) / DRIFT_PERIOD)
        level = drift * np.exp(ITER_JITTER * rng.standard_normal((jobs, iters)))
        dev = base[:, :, :, None] * level[:, :, None, None, None, None]
        dev = dev * np.exp(CHUNK_JITTER * rng.standard_normal((jobs, iters, pp, tp, 3, m)))
        wire = np.broadcast_to(self.piece_wire[:, None, :], (pp - 1, m, tp))
        wire = wire * np.exp(XFER_JITTER * rng.standard_normal((jobs, iters, 2, pp - 1, m, tp)))
        alpha = self.piece_alpha[:, None, :]
        for j, listed in enumerate(faults):
            for fault in [listed] if isinstance(listed, tuple) else listed or []:
                kind, onset, where, rank, sev, *end = fault
                span = slice(onset, end[0] if end else None)
                if kind == "slow":
                    dev[j, span, where, rank] /= sev
                else:
                    wire[j, span, :, where, :, rank] /= sev
        piece = alpha + wire
        observed = self.iteration_s(dev.max(axis=3), piece.max(-1))
        spikes = rng.random((jobs, iters)) < SPIKE_PROB
        observed = observed * np.where(spikes, rng.uniform(*SPIKE_RANGE, (jobs, iters)), 1.0)

        def noise(shape):
            return MEASURE_SIGMA_S * rng.standard_normal(shape)

        return Block(
            np.maximum(dev + noise(dev.shape), 1e-7),
            self.pool[0][idx],
            np.maximum(piece + noise(piece.shape), 1e-7),
            np.maximum(observed + noise(observed.shape), 1e-7),
        )
