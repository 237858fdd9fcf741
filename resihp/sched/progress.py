"""The paper's Algorithm 1 (progress-aware workload migration) inside an event-driven simulation.

The simulation runs forward chunks only, each group (replica, stage) in the compiled order
(sorted by (micro-batch, source replica)); a chunk of (src, j) at stage i starts once the same
micro-batch finished stage i-1 wherever that ran. A chunk's duration is its F+B+W cost on the
group, the steady-state 1F1B slot. After every completion at stage i, Algorithm 1 looks at stage i:

    P[d] = forward chunks finished at (d, i)       d over the replicas sharing stage i's layers
    d_min, d_max = argmin P, argmax P (ties: lowest replica index)
    if P[d_max] - P[d_min] > delta: move d_min's next not-started native chunk to d_max,
                                    if d_max's memory fits one more (at its arrival)

`mem_ok(g, counts)` judges a group by its chunk count per source replica (`counts[src]`): a
migrated plan's compiled order keeps up to one template's live count per source pipeline, so one
more chunk from a new source costs more memory than one more from a source already there
(`sched.model.chunk_memory_check`).

Fail-stop eviction (no delta test): a hollow group's chunks are dealt out at the first slot, each
to the live peer with the least queued work (the one projected to be most advanced), memory
permitting. Each chunk moves at most once, so the loop ends.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque

from .migrate import stage_peers


def progress_migrate(
    plan, scale, costs, mem_ok=None, delta: int = 0, affected_only: bool = True
) -> list[tuple]:
    """Algorithm 1; returns the assignment moves (src, j, i, exec replica).

    `affected_only` (our reading, default) applies the progress test only at stages whose replicas
    run at different speeds: elsewhere progress gaps are pipeline fill and drain passed on from
    another stage, and moving that work overloads healthy replicas. False checks every stage.
    """
    peers = stage_peers(plan)
    groups = [(d, i) for d, stages in enumerate(plan.replicas) for i in range(len(stages))]
    queue = {g: [(j, g[0]) for j in range(plan.microbatches[g[0]])] for g in groups}
    held = {g: {g[0]: len(q)} for g, q in queue.items()}  # chunks per source replica
    queued = {g: sum(costs[g[0]]) * scale[g] if math.isfinite(scale[g]) else 0.0 for g in groups}
    execu: dict = {}
    native = {g: deque(range(plan.microbatches[g[0]])) for g in groups}  # not started, not moved

    def fits(g, src) -> bool:
        """Whether group g can run one more chunk of source replica `src`."""
        if mem_ok is None:
            return True
        counts = dict(held[g])
        counts[src] = counts.get(src, 0) + 1
        return mem_ok(g, counts)

    def move(src, j, i, dst) -> None:
        g, h = (src, i), (dst, i)
        queue[g].remove((j, src))
        native[g].remove(j)
        bisect.insort(queue[h], (j, src))
        held[g][src] -= 1
        held[h][src] = held[h].get(src, 0) + 1
        queued[h] += costs[src][j] * scale[h]
        execu[(src, j, i)] = dst

    # Fail-stop eviction at the first slot.
    for d, i in groups:
        if math.isfinite(scale[(d, i)]):
            continue
        live = [e for e in peers[i][d] if math.isfinite(scale[(e, i)])]
        for j, src in list(queue[(d, i)]):
            ok = [e for e in live if fits((e, i), src)]
            if not ok:
                raise ValueError(f"stage {i} of replica {d} is lost and no peer can take its work")
            e = min(ok, key=lambda e: (queued[(e, i)] + costs[src][j] * scale[(e, i)], e))
            move(src, j, i, e)

    done: dict = {}
    waiting: dict = {}
    running: dict = dict.fromkeys(groups)
    progress = dict.fromkeys(groups, 0)
    free = dict.fromkeys(groups, 0.0)
    heap: list = []
    seq = 0

    def try_start(g, now: float) -> None:
        nonlocal seq
        if running[g] is not None or not queue[g]:
            return
        j, src = queue[g][0]
        i = g[1]
        ready = 0.0
        if i > 0:
            ready = done.get((src, j, i - 1))
            if ready is None:
                waiting.setdefault((src, j, i - 1), []).append(g)
                return
        queue[g].pop(0)
        if src == g[0] and native[g] and native[g][0] == j:
            native[g].popleft()
        running[g] = (j, src)
        start = max(now, ready, free[g])
        seq += 1
        heapq.heappush(heap, (start + costs[src][j] * scale[g], seq, g))

    # Per (stage, peer set): the live replicas, when Algorithm 1 looks at that stage at all.
    watch: dict = {}
    for i, by in enumerate(peers):
        for ds in {tuple(v) for v in by.values()}:
            live = [e for e in ds if math.isfinite(scale[(e, i)])]
            if len(live) >= 2 and (not affected_only or len({scale[(e, i)] for e in ds}) > 1):
                watch[(i, ds)] = live

    def step(i: int, live: list[int]) -> None:
        ps = [progress[(e, i)] for e in live]
        lo, hi = min(ps), max(ps)
        d_min = live[ps.index(lo)]  # ties: lowest replica index (live is sorted)
        d_max = live[ps.index(hi)]
        if progress[(d_max, i)] - progress[(d_min, i)] <= delta:
            return
        pending = native[(d_min, i)]
        if pending and fits((d_max, i), d_min):
            move(d_min, pending[0], i, d_max)
            try_start((d_max, i), now)
            try_start((d_min, i), now)

    now = 0.0
    for g in groups:
        try_start(g, 0.0)
    while heap:
        now = heap[0][0]
        batch = []
        while heap and heap[0][0] <= now + 1e-12:  # one slot: every completion at this time
            _, _, g = heapq.heappop(heap)
            j, src = running[g]
            running[g] = None
            done[(src, j, g[1])] = now
            progress[g] += 1
            free[g] = now
            batch.append((g, (src, j, g[1])))
        if watch:
            for i, ds in sorted({(g[1], tuple(peers[g[1]][g[0]])) for g, _ in batch}):
                live = watch.get((i, ds))
                if live is not None:
                    step(i, live)
        for g, key in batch:
            try_start(g, now)
            for h in waiting.pop(key, ()):
                try_start(h, now)
    assert all(not q for q in queue.values()), "progress simulation left chunks unrun"
    return sorted((s, j, i, d) for (s, j, i), d in execu.items())
