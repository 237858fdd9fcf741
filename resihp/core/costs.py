"""What the pipeline simulator needs to know about time and memory, in the MTP's linear form.

Every chunk's time is `c0 + alpha*N + beta*sum_sq` for its executing group and kind (the paper's
micro-batch time predictor, eq. 1; `linear_time` is that formula, the only copy), so the analytical
cost model (`resihp.cost.build_costs`), a fitted predictor (`resihp.cost.calibration`) or a
hand-written table in a test all plug in alike.

Gradient sync is priced per gradient segment (`core.segments`): `segment_s[layers]` is the exposed
time of that segment's reduction, `allreduce_bytes[device]` the bytes a device hands to its
segments' all-reduces per iteration (what the runtime counts in its trace).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

GroupKey = tuple[int, int]


def linear_time(c0, alpha, beta, n, sum_sq):
    """Seconds of a chunk of `n` tokens whose segment lengths square-sum to `sum_sq` (vectorised)."""
    return c0 + alpha * n + beta * sum_sq


@dataclass
class Costs:
    tokens: np.ndarray  # (G,) tokens of each micro-batch of the global batch
    sum_sq: np.ndarray  # (G,) sum of squared segment lengths of each micro-batch
    chunk: dict[GroupKey, np.ndarray]  # (3, 3): rows F, B, W; columns c0 [s], alpha, beta
    p2p: Callable[[GroupKey, GroupKey], float] = lambda a, b: 0.0  # s per activation/gradient transfer
    segment_s: dict[tuple[int, int], float] = field(default_factory=dict)  # exposed sync per segment
    step_s: float = 0.0  # optimizer step
    mem_static: dict[int, float] = field(default_factory=dict)  # bytes per device: weights, grads, Adam
    mem_act: dict[int, float] = field(default_factory=dict)  # bytes per live micro-batch per device
    send_blocks: bool = False  # a P2P send occupies the sender (head-of-line blocking)
    allreduce_bytes: dict[int, float] = field(default_factory=dict)  # per device per iteration

    def chunk_times(self, g: GroupKey, kind, mb_index: np.ndarray) -> np.ndarray:
        """Seconds of group g's chunks of kind `kind` (one, or one per entry) on global micro-batches
        `mb_index`."""
        c0, alpha, beta = np.asarray(self.chunk[g])[kind].T
        return linear_time(c0, alpha, beta, self.tokens[mb_index], self.sum_sq[mb_index])

    def vertex_times(
        self, groups: Sequence[GroupKey], group_index: np.ndarray, kind: np.ndarray, mb_index: np.ndarray
    ) -> np.ndarray:
        """`chunk_times` of many groups at once: chunk i is kind `kind[i]` of global micro-batch
        `mb_index[i]` on group `groups[group_index[i]]` (index arrays broadcast together)."""
        rows = np.stack([self.chunk[g] for g in groups])[group_index, kind]  # (..., 3)
        c0, alpha, beta = rows[..., 0], rows[..., 1], rows[..., 2]
        return linear_time(c0, alpha, beta, self.tokens[mb_index], self.sum_sq[mb_index])


def uniform_costs(plan, f: float = 1.0, b: float = 1.0, w: float = 1.0, p2p: float = 0.0) -> Costs:
    """Constant chunk times on every group: for tests and analytic checks."""
    g = plan.global_microbatches
    table = np.array([[f, 0.0, 0.0], [b, 0.0, 0.0], [w, 0.0, 0.0]])
    chunk = {
        (d, i): table
        for d, stages in enumerate(plan.replicas)
        for i, st in enumerate(stages)
        if not st.hollow
    }
    return Costs(np.ones(g), np.zeros(g), chunk, p2p=lambda a, b_: p2p)
