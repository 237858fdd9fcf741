"""PP-level adaptation: contiguous layer splits for stages of unequal speed.

- `repartition_paper`: the paper's §4.2 reading: layers in proportion to stage speed (largest
  remainder), then local min-max fix-up moves of one layer, then a memory check (one split for all
  DP replicas, so the caller passes the per-stage minimum speed over replicas).
- `minmax_partition`: ours, exact. Stage s of speed v_s holding n_s layers takes
  (n_s + [s first]·e + [s last]·h) / v_s; we minimise the largest such time subject to
  1 <= n_s <= cap_s (memory). The optimum is one of the O(p·L) candidate times, and a greedy pass
  (each stage takes as many layers as fit under T, leaving one per later stage) decides whether a
  bottleneck T is feasible, so a binary search over the sorted candidates is exact.

Both raise ValueError when no split fits memory.
"""

from __future__ import annotations

import math


def stage_times(counts, speeds, first_cost: float = 0.0, last_cost: float = 0.0) -> list[float]:
    p = len(counts)
    return [
        (n + (first_cost if s == 0 else 0.0) + (last_cost if s == p - 1 else 0.0)) / v if v > 0 else math.inf
        for s, (n, v) in enumerate(zip(counts, speeds))
    ]


def _check(num_layers: int, speeds, caps) -> list[int]:
    p = len(speeds)
    if p < 1 or num_layers < p:
        raise ValueError(f"cannot split {num_layers} layers over {p} stages (each needs >= 1)")
    if any(v <= 0 for v in speeds):
        raise ValueError(f"stage speeds {list(speeds)}: every stage needs a speed > 0")
    caps = [num_layers] * p if caps is None else [min(int(c), num_layers) for c in caps]
    if min(caps) < 1 or sum(caps) < num_layers:
        raise ValueError(f"no layer split fits memory: {num_layers} layers, per-stage capacity {caps}")
    return caps


def repartition_paper(
    num_layers: int, speeds, caps=None, first_cost: float = 0.0, last_cost: float = 0.0
) -> tuple[int, ...]:
    """Speed-proportional split, largest remainder, min-max fix-up, memory-checked."""
    caps = _check(num_layers, speeds, caps)
    p = len(speeds)
    total = float(sum(speeds))
    raw = [num_layers * v / total for v in speeds]
    counts = [max(1, int(r)) for r in raw]
    order = sorted(range(p), key=lambda s: (-(raw[s] - int(raw[s])), s))
    k = 0
    while sum(counts) < num_layers:
        counts[order[k % p]] += 1
        k += 1
    while sum(counts) > num_layers:  # the max(1, .) floor overshot: take from the largest share
        s = max((s for s in range(p) if counts[s] > 1), key=lambda s: (counts[s] - raw[s], s))
        counts[s] -= 1
    # Memory first: push layers off over-full stages onto the neighbour with the most room.
    for _ in range(num_layers * p):
        over = [s for s in range(p) if counts[s] > caps[s]]
        if not over:
            break
        s = over[0]
        room = [t for t in range(p) if counts[t] < caps[t]]
        t = min(room, key=lambda t: (stage_times(counts, speeds, first_cost, last_cost)[t], abs(t - s)))
        counts[s] -= 1
        counts[t] += 1
    # Min-max fix-up: move one layer off the bottleneck while that lowers the maximum.
    for _ in range(num_layers * p):
        times = stage_times(counts, speeds, first_cost, last_cost)
        worst = max(range(p), key=lambda s: (times[s], -s))
        best, best_max = None, max(times)
        for t in range(p):
            if t == worst or counts[worst] <= 1 or counts[t] >= caps[t]:
                continue
            trial = list(counts)
            trial[worst] -= 1
            trial[t] += 1
            m = max(stage_times(trial, speeds, first_cost, last_cost))
            if m < best_max - 1e-12:
                best, best_max = trial, m
        if best is None:
            break
        counts = best
    return tuple(counts)


def _greedy_fits(T: float, num_layers: int, speeds, caps, first_cost, last_cost) -> list[int] | None:
    p = len(speeds)
    left = num_layers
    counts = []
    for s in range(p):
        extra = (first_cost if s == 0 else 0.0) + (last_cost if s == p - 1 else 0.0)
        fit = math.floor(T * speeds[s] - extra + 1e-9)
        take = min(fit, caps[s], left - (p - 1 - s))
        if s == p - 1:
            if left > min(fit, caps[s]):
                return None
            take = left
        if take < 1:
            return None
        counts.append(take)
        left -= take
    return counts


def minmax_partition(
    num_layers: int, speeds, caps=None, first_cost: float = 0.0, last_cost: float = 0.0
) -> tuple[int, ...]:
    """Exact min-max contiguous split (see module docstring); ties resolved towards earlier stages."""
    caps = _check(num_layers, speeds, caps)
    p = len(speeds)
    cands = set()
    for s in range(p):
        extra = (first_cost if s == 0 else 0.0) + (last_cost if s == p - 1 else 0.0)
        for n in range(1, min(caps[s], num_layers - p + 1) + 1):
            cands.add((n + extra) / speeds[s])
    cands = sorted(cands)
    lo, hi = 0, len(cands) - 1
    if _greedy_fits(cands[hi], num_layers, speeds, caps, first_cost, last_cost) is None:
        raise ValueError(f"no layer split fits memory: {num_layers} layers, per-stage capacity {caps}")
    while lo < hi:
        mid = (lo + hi) // 2
        if _greedy_fits(cands[mid], num_layers, speeds, caps, first_cost, last_cost) is None:
            lo = mid + 1
        else:
            hi = mid
    return tuple(_greedy_fits(cands[lo], num_layers, speeds, caps, first_cost, last_cost))
