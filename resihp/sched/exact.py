"""Exact reference for the scheduler's combinatorial core, on small instances (tests, benchmarks).

An instance: `dp` replicas x `pp` stages with group speeds v[d][i] (0 = hollow), `num_layers`
layers, micro-batch costs per replica, and the LM head's cost on the last stage. A plan's
bottleneck is its most loaded group: (layers of the stage + head) x (cost it runs) / speed. Two
plan families are searched, as `resihp` does:

- a common layer split with per-stage migration: per stage the best makespan M_i of the chunks over
  the live replicas is independent of the layer count, so the bottleneck is
  max_i (n_i + head_i)·M_i and the best split is `minmax_partition` on speeds 1/M_i;
- per-replica splits without migration (only without hollow groups): each replica's exact
  min-max split on its own speeds.

`ours_bottleneck` uses the heuristic `balance_stage` for M_i, `exact_bottleneck` branch and bound.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from .migrate import balance_stage, optimal_stage, stage_bottleneck
from .partition import minmax_partition, stage_times


@dataclass(frozen=True)
class Instance:
    speeds: tuple[tuple[float, ...], ...]  # [replica][stage]
    num_layers: int
    costs: tuple[tuple[float, ...], ...]  # [replica][micro-batch]
    head: float = 0.0

    @property
    def dp(self) -> int:
        return len(self.speeds)

    @property
    def pp(self) -> int:
        return len(self.speeds[0])


COST_CLASSES = (0.8, 1.0, 1.0, 1.3, 2.0)  # packed micro-batches: relative F+B+W cost classes


def random_instance(rng: random.Random, max_pp: int = 6, max_dp: int = 4, max_mb: int = 16) -> Instance:
    """Random speeds (some slow, maybe one hollow group), layers and sequence-length-like costs."""
    dp, pp = rng.randint(2, max_dp), rng.randint(2, max_pp)
    m = rng.randint(1, max(1, max_mb // dp))
    speeds = [[1.0] * pp for _ in range(dp)]
    for _ in range(rng.randint(1, 3)):
        speeds[rng.randrange(dp)][rng.randrange(pp)] = rng.choice([0.25, 0.4, 0.5, 0.6, 0.75, 0.85])
    if rng.random() < 0.3:
        speeds[rng.randrange(dp)][rng.randrange(pp)] = 0.0
    for i in range(pp):  # keep one live group per stage
        if all(speeds[d][i] == 0 for d in range(dp)):
            speeds[0][i] = 1.0
    costs = [[rng.choice(COST_CLASSES) for _ in range(m)] for _ in range(dp)]
    return Instance(tuple(map(tuple, speeds)), rng.randint(pp, 3 * pp), tuple(map(tuple, costs)),
                    rng.choice([0.0, 0.6, 2.3]))  # fmt: skip


def _stage(inst: Instance, i: int):
    scale = {d: 1.0 / inst.speeds[d][i] if inst.speeds[d][i] > 0 else math.inf for d in range(inst.dp)}
    chunks = [(d, (d, j), c) for d in range(inst.dp) for j, c in enumerate(inst.costs[d])]
    return scale, chunks


def _common(inst: Instance, makespans) -> float:
    counts = minmax_partition(inst.num_layers, [1.0 / m for m in makespans], last_cost=inst.head)
    return max(stage_times(counts, [1.0 / m for m in makespans], last_cost=inst.head))


def _per_replica(inst: Instance) -> float:
    if any(v <= 0 for row in inst.speeds for v in row):
        return math.inf
    worst = 0.0
    for d in range(inst.dp):
        counts = minmax_partition(inst.num_layers, inst.speeds[d], last_cost=inst.head)
        load = sum(inst.costs[d])
        worst = max(worst, load * max(stage_times(counts, inst.speeds[d], last_cost=inst.head)))
    return worst


def ours_bottleneck(inst: Instance, min_gain: float = 0.0) -> float:
    spans = []
    for i in range(inst.pp):
        scale, chunks = _stage(inst, i)
        spans.append(stage_bottleneck(scale, chunks, balance_stage(scale, chunks, None, min_gain)))
    return min(_common(inst, spans), _per_replica(inst))


def exact_bottleneck(inst: Instance) -> float:
    spans = []
    for i in range(inst.pp):
        scale, chunks = _stage(inst, i)
        upper = stage_bottleneck(scale, chunks, balance_stage(scale, chunks))
        spans.append(min(upper, optimal_stage(scale, chunks, upper * (1 + 1e-9))))
    return min(_common(inst, spans), _per_replica(inst))
