"""The live detector's inputs and its MTP: work classes, a record's chunks, the online fit.

`work_classes` says which devices do the same work (compared with each other, `online.py`);
`record_chunks` turns a trace record into the chunks the detector reads; `OnlineMTP` is the
micro-batch time predictor `c0 + α·N + β·Σl²` (`cost.calibration`'s robust fit) per (class, kind),
refitted on a rolling window. Torch-free.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from resihp.core.plan import Plan
from resihp.core.trace_format import COMPUTE_OPS
from resihp.cost.calibration import LinearTime, fit_linear_times

KIND_INDEX = {op: k for k, op in enumerate(COMPUTE_OPS)}


@dataclass(frozen=True)
class Chunks:
    """One device's compute chunks of one iteration: kind index (F 0, B 1, W 2), tokens N, Σl²,
    measured compute-only seconds; parallel arrays. `cpu_s`: the process's CPU seconds in the
    iteration, when the device is a CPU (0: not used)."""

    kinds: np.ndarray
    n: np.ndarray
    sum_sq: np.ndarray
    measured: np.ndarray
    cpu_s: float = 0.0


def work_classes(plan: Plan) -> dict[int, tuple]:
    """device -> its work: (stage index, layers, heads, FFN columns). Equal keys, equal work."""
    out = {}
    for stages in plan.replicas:
        for i, st in enumerate(stages):
            for k, dev in enumerate(st.devices):
                heads = st.tp_split[k] if st.tp_split else 0
                ffn = st.ffn_split[k] if st.ffn_split else 0
                out[dev] = (i, st.layers, heads, ffn)
    return out


def record_chunks(plan: Plan, batch, record: Mapping, cpu: bool = False) -> Chunks:
    """A trace record's compute rows (`instrs`, InstrRow or its JSON list) as `Chunks`; `batch` the
    iteration's `Workload.pack(it, G)` (its micro-batches' Σl²; packed, so N = seq_len); with
    `cpu` (a CPU worker), the record's `cpu_s` too."""
    rows = [r for r in record["instrs"] if r[0] in KIND_INDEX]
    mbs = np.array([plan.mb_offset(r[1]) + r[2] for r in rows], dtype=np.int64)
    return Chunks(
        np.array([KIND_INDEX[r[0]] for r in rows], dtype=np.int64),
        np.full(len(rows), float(batch.seq_len)),
        np.asarray(batch.sum_sq, dtype=np.float64)[mbs] if rows else np.zeros(0),
        np.array([r[3] for r in rows], dtype=np.float64),
        float(record.get("cpu_s", 0.0)) if cpu else 0.0,
    )


class OnlineMTP:
    """Per (class, kind) `LinearTime`, fitted on the newest `keep` iterations of healthy samples."""

    def __init__(self, keep: int) -> None:
        self.window: deque[list[tuple]] = deque(maxlen=keep)  # per iteration: (key, n, sum_sq, t)
        self.fits: dict[tuple, LinearTime] = {}

    def add(self, rows: list[tuple]) -> None:
        self.window.append(rows)

    def refit(self) -> None:
        """Fit every (class, kind) with samples; a key without samples keeps its last fit."""
        rows = [r for it in self.window for r in it]
        counts: dict[tuple, int] = {}
        for r in rows:
            counts[r[0]] = counts.get(r[0], 0) + 1
        rows = [r for r in rows if counts[r[0]] >= 3]  # up to 3 coefficients
        self.fits.update(fit_linear_times(rows))

    def predict(self, cls: tuple, chunks: Chunks) -> np.ndarray:
        """Predicted seconds of each chunk (NaN where its (class, kind) has no fit)."""
        out = np.full(chunks.kinds.size, np.nan)
        for k in np.unique(chunks.kinds):
            fit = self.fits.get((cls, int(k)))
            if fit is not None:
                sel = chunks.kinds == k
                out[sel] = fit.predict(chunks.n[sel], chunks.sum_sq[sel])
        return out
