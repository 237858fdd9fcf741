"""What the pipeline simulator needs to know about time and memory, in the MTP's linear form.

Every chunk's time is `c0 + alpha*N + beta*sum_sq` for its executing group and kind (the paper's
micro-batch time predictor, eq. 1), so the analytical cost model (`resihp.cost.build_costs`), a
fitted predictor (`resihp.cost.calibration`) or a hand-written table in a test all plug in alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

GroupKey = tuple[int, int]


@dataclass
class Costs:
    tokens: np.ndarray  # (G,) tokens of each micro-batch of the global batch
    sum_sq: np.ndarray  # (G,) sum of squared segment lengths of each micro-batch
    chunk: dict[GroupKey, np.ndarray]  # (3, 3): rows F, B, W; columns c0 [s], alpha, beta
    p2p: Callable[[GroupKey, GroupKey], float] = lambda a, b: 0.0  # s per activation/gradient transfer
    allreduce_s: dict[GroupKey, float] = field(default_factory=dict)  # exposed gradient sync per group
    step_s: float = 0.0  # optimizer step
    mem_static: dict[int, float] = field(default_factory=dict)  # bytes per device: weights, grads, Adam
    mem_act: dict[int, float] = field(default_factory=dict)  # bytes per live micro-batch per device
    send_blocks: bool = False  # a P2P send occupies the sender (head-of-line blocking)

    def chunk_times(self, g: GroupKey, kind: int, mb_index: np.ndarray) -> np.ndarray:
        c0, alpha, beta = self.chunk[g][kind]
        return c0 + alpha * self.tokens[mb_index] + beta * self.sum_sq[mb_index]


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
