"""Cost-independent structure of a compiled Program for the DAG evaluation, and its result type."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from resihp.core.costs import Costs
from resihp.core.program import B, F, Program, W


@dataclass
class IterationResult:
    iteration_s: float
    busy_s: dict[int, float]  # per device: compute time
    idle_s: dict[int, float]  # per device: iteration_s - busy_s
    peak_memory_bytes: dict[int, float]
    live_peak: dict[tuple[int, int], int]  # per group: most micro-batches holding activations
    group_end_s: dict[tuple[int, int], float]
    spans: dict[tuple[int, int], list[tuple[int, int, int, float, float]]]  # (kind, src, j, start, end)

    @property
    def bubble_fraction(self) -> float:
        """Mean over devices of idle / iteration time."""
        if not self.busy_s:
            return 0.0
        return float(np.mean([idle / self.iteration_s for idle in self.idle_s.values()]))


class Structure:
    """Cost-independent arrays of a Program: integer chunk keys and data-dependency keys.

    A chunk (kind, src, j, stage) has key ((kind*dp + src)*M + j)*P + stage. F depends on F of the
    previous stage; B on the next stage's chunk after which the gradient is sent (B for zbh1,
    W otherwise, since 1F1B and GPipe send the gradient after the whole backward).
    """

    def __init__(self, program: Program, first_replica_only: bool = False) -> None:
        plan = program.plan
        self.groups = [g for g in program.chunks if program.chunks[g]]
        self.dp, self.m = plan.dp, max(plan.microbatches)
        if first_replica_only:  # keys of replica 0 alone (symmetric plans: the rest look the same)
            self.groups = [g for g in self.groups if g[0] == 0]
            self.dp = 1
        self.p = max(len(s) for s in plan.replicas)
        self.num_keys = 3 * self.dp * self.m * self.p
        offsets = np.array([plan.mb_offset(d) for d in range(self.dp)])
        last = np.array([len(s) - 1 for s in plan.replicas[: self.dp]])
        execs = np.broadcast_to(np.arange(self.dp)[:, None, None], (self.dp, self.m, self.p)).copy()
        for src, j, i, dst in plan.assignment:
            execs[src, j, i] = dst
        grad_kind = B if plan.schedule == "zbh1" else W
        self.me, self.dep, self.arrays, self.peers, self.live_peak = {}, {}, {}, {}, {}
        for g in self.groups:
            ch = program.chunks[g]
            arr = np.fromiter(itertools.chain.from_iterable(ch), np.int64, 3 * len(ch)).reshape(-1, 3)
            kind, src, j = arr[:, 0], arr[:, 1], arr[:, 2]
            i = g[1]
            fwd = (kind == F) & (i > 0)
            bwd = (kind == B) & (i < last[src])
            dep = np.full(len(kind), -1, dtype=np.int64)
            dep[fwd] = self._key(F, src[fwd], j[fwd], i - 1)
            dep[bwd] = self._key(grad_kind, src[bwd], j[bwd], i + 1)
            self.me[g] = self._key(kind, src, j, i).tolist()
            self.dep[g] = dep.tolist()
            self.arrays[g] = (kind, offsets[src] + j)
            # (mask, peer replica per chunk, peer stage, data flows into g?) for edge and send times
            up = (kind == F) & (i < last[src])
            down = (kind == grad_kind) & (i > 0)
            self.peers[g] = [
                (mask, execs[src[mask], j[mask], stage], stage, into)
                for mask, stage, into in ((fwd, i - 1, True), (bwd, i + 1, True), (up, i + 1, False),
                                          (down, i - 1, False))
                if mask.any()
            ]  # fmt: skip
            self.live_peak[g] = int(np.cumsum((kind == F).astype(int) - (kind == W)).max())

    def _key(self, kind, src, j, stage):
        return ((kind * self.dp + src) * self.m + j) * self.p + stage

    def lane(self, g, costs: Costs) -> tuple[list, list, list]:
        """Per chunk of g: incoming edge time, duration, and time a blocking send holds g."""
        kind, mbi = self.arrays[g]
        table = costs.chunk[g]
        dur = table[kind, 0] + table[kind, 1] * costs.tokens[mbi] + table[kind, 2] * costs.sum_sq[mbi]
        edge = np.zeros(len(kind))
        send = np.zeros(len(kind))
        for mask, peers, stage, into in self.peers[g]:
            if not into and not costs.send_blocks:
                continue
            vals = np.zeros(len(peers))
            for r in np.unique(peers):
                other = (int(r), stage)
                vals[peers == r] = costs.p2p(other, g) if into else costs.p2p(g, other)
            (edge if into else send)[mask] += vals
        return edge.tolist(), dur.tolist(), send.tolist()
