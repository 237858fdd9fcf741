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

    Groups are numbered in `groups` order and a chunk (j, src) is coded c = j * dp + src (ints
    order as the tuples do); its global micro-batch index is u[c], its slot at stage i in the flat
    `done` list u[c] * width + i.
    """
    peers = stage_peers(plan)
    groups = [(d, i) for d, stages in enumerate(plan.replicas) for i in range(len(stages))]
    gid = {g: k for k, g in enumerate(groups)}
    dp = len(plan.replicas)
    mbs = plan.microbatches
    width = max(len(stages) for stages in plan.replicas)
    offset = [sum(mbs[:d]) for d in range(dp)]
    u_of = [0] * (max(mbs, default=0) * dp)
    cost_u = [0.0] * sum(mbs)
    for d in range(dp):
        for j in range(mbs[d]):
            u_of[j * dp + d] = offset[d] + j
            cost_u[offset[d] + j] = costs[d][j]
    rate = [scale[g] for g in groups]  # seconds per unit cost
    queue = [[j * dp + d for j in range(mbs[d])] for d, _ in groups]  # sorted codes not started
    held = [{d: len(q)} for (d, _), q in zip(groups, queue)]  # chunks per source replica
    queued = [sum(costs[d]) * rate[k] if math.isfinite(rate[k]) else 0.0 for k, (d, _) in enumerate(groups)]
    execu: dict = {}
    native = [deque(q) for q in queue]  # codes of the group's own chunks not started, not moved

    def fits(k, src) -> bool:
        """Whether group k can run one more chunk of source replica `src`."""
        if mem_ok is None:
            return True
        counts = dict(held[k])
        counts[src] = counts.get(src, 0) + 1
        return mem_ok(groups[k], counts)

    def move(src, j, i, dst) -> None:
        g, h = gid[(src, i)], gid[(dst, i)]
        c = j * dp + src
        queue[g].remove(c)
        native[g].remove(c)
        bisect.insort(queue[h], c)
        held[g][src] -= 1
        held[h][src] = held[h].get(src, 0) + 1
        queued[h] += costs[src][j] * rate[h]
        execu[(src, j, i)] = dst

    # Fail-stop eviction at the first slot.
    for k, (d, i) in enumerate(groups):
        if math.isfinite(rate[k]):
            continue
        live = [gid[(e, i)] for e in peers[i][d] if math.isfinite(scale[(e, i)])]
        for c in list(queue[k]):
            j, src = divmod(c, dp)
            ok = [e for e in live if fits(e, src)]
            if not ok:
                raise ValueError(f"stage {i} of replica {d} is lost and no peer can take its work")
            e = min(ok, key=lambda e: (queued[e] + costs[src][j] * rate[e], groups[e][0]))
            move(src, j, i, groups[e][0])

    n_groups = len(groups)
    done: list = [None] * (sum(mbs) * width)  # slot -> finish time
    waiting: dict = {}  # slot -> groups waiting for it
    running = [-1] * n_groups  # slot of the chunk a group runs, -1: idle
    progress = [0] * n_groups
    free = [0.0] * n_groups
    heap: list = []
    seq = 0
    stage_of = [i for _, i in groups]
    home = [d for d, _ in groups]
    heappush, heappop = heapq.heappush, heapq.heappop

    def try_start(g, now: float) -> None:
        nonlocal seq
        q = queue[g]
        if running[g] >= 0 or not q:
            return
        c = q[0]
        u = u_of[c]
        slot = u * width + stage_of[g]
        start = now  # max(now, ready, free), first of equals
        if stage_of[g] > 0:
            ready = done[slot - 1]
            if ready is None:
                waiting.setdefault(slot - 1, []).append(g)
                return
            if ready > start:
                start = ready
        del q[0]
        pending = native[g]
        if pending and pending[0] == c:
            pending.popleft()
        running[g] = slot
        if free[g] > start:
            start = free[g]
        seq += 1
        heappush(heap, (start + cost_u[u] * rate[g], seq, g))

    # Per (stage, peer set): the live replicas' groups, when Algorithm 1 looks at that stage at all.
    watch: dict = {}
    for i, by in enumerate(peers):
        for ds in {tuple(v) for v in by.values()}:
            live = [e for e in ds if math.isfinite(scale[(e, i)])]
            if len(live) >= 2 and (not affected_only or len({scale[(e, i)] for e in ds}) > 1):
                watch[(i, ds)] = [gid[(e, i)] for e in live]
    watched = [(i, tuple(peers[i][d])) for d, i in groups]
    watched = [key if key in watch else None for key in watched]  # per group: its watch key

    def step(live: list[int]) -> None:
        ps = [progress[e] for e in live]
        lo, hi = min(ps), max(ps)
        k_min = live[ps.index(lo)]  # ties: lowest replica index (live is sorted)
        k_max = live[ps.index(hi)]
        if progress[k_max] - progress[k_min] <= delta:
            return
        pending = native[k_min]
        if pending and fits(k_max, home[k_min]):
            move(home[k_min], pending[0] // dp, stage_of[k_min], home[k_max])
            try_start(k_max, now)
            try_start(k_min, now)

    now = 0.0
    for g in range(n_groups):
        try_start(g, 0.0)
    while heap:
        now = heap[0][0]
        batch = []
        while heap and heap[0][0] <= now + 1e-12:  # one slot: every completion at this time
            g = heappop(heap)[2]
            key = running[g]
            running[g] = -1
            done[key] = now
            progress[g] += 1
            free[g] = now
            batch.append((g, key))
        if watch:
            if len(batch) == 1:
                key = watched[batch[0][0]]
                if key is not None:
                    step(watch[key])
            else:
                for key in sorted({watched[g] for g, _ in batch} - {None}):
                    step(watch[key])
        for g, key in batch:
            try_start(g, now)
            for h in waiting.pop(key, ()):
                try_start(h, now)
    assert all(not q for q in queue), "progress simulation left chunks unrun"
    return sorted((s, j, i, d) for (s, j, i), d in execu.items())
