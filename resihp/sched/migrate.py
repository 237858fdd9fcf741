"""DP-level adaptation: moving single (micro-batch, stage) chunks to the same stage of another replica.

Inputs shared by both methods: `scale[(d, i)]` = seconds per unit of micro-batch cost on group
(d, i) (math.inf for a hollow group), `costs[d][j]` = relative cost of micro-batch j of replica d
(F+B+W FLOPs, so packed sequences with long documents weigh more), and `peers[i]` = the replicas
whose stage i holds the same layers (only those can exchange stage-i work). `mem_ok(g, counts)`
says whether group g can run `counts[src]` chunks of each source replica src (the compiled order
keeps up to one template's live count per source, `sched.model.chunk_memory_check`). Both return
the Plan.assignment moves (src, j, i, exec replica) for chunks that leave home.

- `progress_migrate`: the paper's Algorithm 1 inside an event-driven simulation of the schedule
  (`resihp.sched.progress`).
- `balance_migrate`: ours. Per stage the iteration is bounded by the most loaded group, so each
  stage is a makespan problem on machines of different speeds: evicted chunks are placed
  largest-cost first on the machine that finishes them earliest, then single moves off the most
  loaded machine are applied while they lower its load by more than `min_gain`.
"""

from __future__ import annotations

import bisect
import math

import numpy as np

from resihp.core.workload import packed
from resihp.cost import flops

from .model import memo


def mean_chunk_flops(ctx, plan, iteration: int = 0) -> float:
    """F+B+W FLOPs of one layer for the iteration's mean micro-batch (the unit `costs` scale)."""
    batch = _batch(ctx, sum(plan.microbatches), iteration)
    lin = flops.linear_flops_per_token(ctx.model) * batch.seq_len
    return float(3 * lin + 3 * flops.attn_core_flops_per_sq(ctx.model) * np.mean(batch.sum_sq))


def _batch(ctx, count: int, iteration: int):
    return packed(ctx.workload, iteration, count)


def microbatch_costs(ctx, plan, iteration: int = 0) -> list[list[float]]:
    """Per replica, the relative F+B+W cost of each micro-batch (mean 1 over the global batch)."""
    mbs = tuple(plan.microbatches)
    key = ("costs", ctx.model, ctx.workload, mbs, iteration)
    return [list(c) for c in memo(key, lambda: _costs(ctx, mbs, iteration))]


def _costs(ctx, microbatches: tuple[int, ...], iteration: int) -> tuple[tuple[float, ...], ...]:
    batch = _batch(ctx, sum(microbatches), iteration)
    lin = flops.linear_flops_per_token(ctx.model) * batch.seq_len
    att = flops.attn_core_flops_per_sq(ctx.model) * np.asarray(batch.sum_sq)
    total = 3 * lin + 3 * att
    total = total / total.mean()
    out, k = [], 0
    for n in microbatches:
        out.append(tuple(float(x) for x in total[k : k + n]))
        k += n
    return tuple(out)


def stage_peers(plan) -> list[dict[int, list[int]]]:
    """Per stage index i: replica d -> the replicas (incl. d) whose stage i has d's layer range."""
    out = []
    for i in range(max(len(s) for s in plan.replicas)):
        by_layers: dict = {}
        for d, stages in enumerate(plan.replicas):
            if i < len(stages):
                by_layers.setdefault(stages[i].layers, []).append(d)
        out.append({d: ds for ds in by_layers.values() for d in ds})
    return out


def _with(counts: dict, add=None, drop=None) -> dict:
    """`counts` (source -> chunks) with one chunk of source `add` more and of `drop` fewer."""
    out = dict(counts)
    if add is not None:
        out[add] = out.get(add, 0) + 1
    if drop is not None:
        out[drop] -= 1
    return out


def balance_stage(scale, chunks, mem_ok=None, min_gain: float = 0.0, movable=None) -> dict:
    """Makespan heuristic for one stage. `scale`: group -> s per unit cost; `chunks`: (home, key,
    cost), the home being the chunk's source replica; `mem_ok(g, counts)` as in the module doc.

    Returns key -> executing group. A chunk whose home is hollow (inf scale) must move; the caller
    raises if no group is live.
    """
    groups = sorted(g for g in scale if math.isfinite(scale[g]))
    if not groups:
        raise ValueError("a stage has no live replica left to run its work")
    load = dict.fromkeys(groups, 0.0)
    count: dict = {g: {} for g in groups}  # group -> source -> chunks
    where = {}
    evicted = []
    for home, key, c in chunks:
        if home in load:
            where[key] = home
            load[home] += c * scale[home]
            count[home][home] = count[home].get(home, 0) + 1
        else:
            evicted.append((c, key, home))
    for c, key, home in sorted(evicted, key=lambda x: (-x[0], x[1])):
        ok = [g for g in groups if mem_ok is None or mem_ok(g, _with(count[g], add=home))]
        if not ok:
            raise ValueError("evicted work fits no surviving replica's memory")
        g = min(ok, key=lambda g: (load[g] + c * scale[g], g))
        where[key] = g
        load[g] += c * scale[g]
        count[g][home] = count[g].get(home, 0) + 1
    cost = {key: c for _, key, c in chunks}
    source = {key: home for home, key, _ in chunks}
    _local_search(where, load, count, cost, scale, groups, mem_ok, min_gain, movable, source)
    if mem_ok is None and movable is None and len(chunks) * len(groups) <= 20000:
        # A fresh largest-first start escapes local optima of the stay-home start (small stages).
        lpt_load = dict.fromkeys(groups, 0.0)
        lpt = {}
        for _, key, c in sorted(chunks, key=lambda x: (-x[2], x[1])):
            g = min(groups, key=lambda g: (lpt_load[g] + c * scale[g], g))
            lpt[key] = g
            lpt_load[g] += c * scale[g]
        _local_search(lpt, lpt_load, None, cost, scale, groups, None, 0.0)
        if max(lpt_load.values()) < max(load.values()) - min_gain - 1e-12:
            return lpt
    return where


def _local_search(
    where, load, count, cost, scale, groups, mem_ok, min_gain, movable=None, source=None, swaps: int = 64
) -> None:
    """Best single move (or, on small stages, pairwise swap) off the most loaded group while that
    lowers its load. Per target group only the chunks nearest the ideal size (L_top - L_h)/(s_top +
    s_h) are tried, so a step costs O(groups · log chunks). With `mem_ok`, `count` (group ->
    source -> chunks) and `source` (key -> source replica) track what each group runs, and a move
    or swap is taken only if every group it adds a chunk to stays within memory."""
    mine: dict = {g: [] for g in groups}
    for k, g in where.items():
        if movable is None or movable(k) or k[0] != g:  # a chunk already away may move on
            mine[g].append((cost[k], k))
    for g in groups:
        mine[g].sort()
    small = len(where) <= swaps

    def fits(h, key, other=None) -> bool:
        """Group h may take chunk `key` (giving back `other`), and `key`'s group `other`."""
        if mem_ok is None:
            return True
        a = source[key]
        if other is None:
            return mem_ok(h, _with(count[h], add=a))
        b = source[other]
        return a == b or (mem_ok(h, _with(count[h], add=a, drop=b)) and
                          mem_ok(where[key], _with(count[where[key]], add=b, drop=a)))  # fmt: skip

    for _ in range(4 * len(where) + 4):
        top = max(groups, key=lambda g: (load[g], -g))
        best, best_val = None, load[top] - min_gain
        items = mine[top]
        for h in groups:
            if h == top:
                continue
            ideal = (load[top] - load[h]) / (scale[top] + scale[h])
            k = bisect.bisect_left(items, (ideal,))
            for c, key in items[max(0, k - 1) : k + 1]:
                val = max(load[top] - c * scale[top], load[h] + c * scale[h])
                if val < best_val - 1e-12 and fits(h, key):
                    best, best_val = (key, h, None), val
            if small:
                for c, key in items:
                    for c2, other in mine[h]:
                        if c2 >= c:
                            break
                        d = c - c2
                        val = max(load[top] - d * scale[top], load[h] + d * scale[h])
                        if val < best_val - 1e-12 and fits(h, key, other):
                            best, best_val = (key, h, other), val
        if best is None:
            return
        key, h, other = best
        if mem_ok is not None:
            a = source[key]
            count[top] = _with(count[top], drop=a, add=None if other is None else source[other])
            count[h] = _with(count[h], add=a, drop=None if other is None else source[other])
        c = cost[key] - (cost[other] if other is not None else 0.0)
        load[top] -= c * scale[top]
        load[h] += c * scale[h]
        where[key] = h
        mine[top].remove((cost[key], key))
        bisect.insort(mine[h], (cost[key], key))
        if other is not None:
            where[other] = top
            mine[h].remove((cost[other], other))
            bisect.insort(mine[top], (cost[other], other))


def balance_migrate(plan, scale, costs, mem_ok=None, min_gain: float = 0.01) -> list[tuple]:
    """Ours: per stage and per layer-sharing peer set, `balance_stage`; returns assignment moves."""
    moves = []
    for i, peers in enumerate(stage_peers(plan)):
        done = set()
        for d, ds in peers.items():
            if d in done:
                continue
            done.update(ds)
            sc = {e: scale[(e, i)] for e in ds}
            chunks = [(e, (e, j), costs[e][j]) for e in ds for j in range(plan.microbatches[e])]
            if not chunks:
                continue
            mean = sum(c * sc[e] for e, _, c in chunks if math.isfinite(sc[e])) / len(ds)
            ok = None if mem_ok is None else (lambda g, counts, i=i: mem_ok((g, i), counts))
            where = balance_stage(sc, chunks, ok, min_gain * mean)
            moves += [(e, j, i, g) for (e, j), g in where.items() if g != e]
    return sorted(moves)


def stage_bottleneck(scale, chunks, where) -> float:
    """Largest group load of one stage under an assignment (key -> group)."""
    load: dict = {}
    for _, key, c in chunks:
        g = where[key]
        load[g] = load.get(g, 0.0) + c * scale[g]
    return max(load.values())


def _fluid_bound(load, inv_speed, work: float) -> float:
    """Smallest T with sum over machines of max(0, T - load_m)·speed_m >= work (a lower bound)."""
    order = sorted(range(len(load)), key=lambda m: load[m])
    rate = acc = 0.0
    for k, m in enumerate(order):
        rate += 1.0 / inv_speed[m]
        acc += load[m] / inv_speed[m]
        t = (work + acc) / rate
        if k + 1 == len(order) or t <= load[order[k + 1]]:
            return t
    return math.inf


def optimal_stage(scale, chunks, upper: float | None = None) -> float:
    """Exact min-makespan of one stage by branch and bound (small instances: tests, benchmarks)."""
    groups = sorted(g for g in scale if math.isfinite(scale[g]))
    items = sorted((c for _, _, c in chunks), reverse=True)
    best = [upper if upper is not None else math.inf]
    sc = [scale[g] for g in groups]
    load = [0.0] * len(groups)
    suffix = [sum(items[k:]) for k in range(len(items) + 1)]

    def rec(k: int, cur: float, low: int) -> None:
        if k == len(items):
            best[0] = min(best[0], cur)
            return
        if max(cur, _fluid_bound(load, sc, suffix[k])) >= best[0] * (1 - 1e-9):
            return
        seen = set()
        first = low if k > 0 and items[k] == items[k - 1] else 0  # equal items: non-decreasing machines
        for m in sorted(range(first, len(sc)), key=lambda m: load[m] + items[k] * sc[m]):
            sig = (round(load[m], 9), sc[m])
            if sig in seen:
                continue
            seen.add(sig)
            load[m] += items[k] * sc[m]
            rec(k + 1, max(cur, load[m]), m)
            load[m] -= items[k] * sc[m]

    rec(0, 0.0, 0)
    return best[0]
