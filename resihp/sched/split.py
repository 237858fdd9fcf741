"""The data-parallel split: how many micro-batches of the global batch each replica runs.

An iteration ends when its slowest replica ends, so once faults leave the replicas of a plan at
different rates (a TP group lost a device, a stage is slow, a PP link is slow) an even split wastes
the faster replicas. Moving whole micro-batches between replicas changes no layer, no TP group and
no shard: a new split costs no state transfer, and the global batch (hence the loss) is unchanged.

Each replica d is modelled as `fill[d] + n·slot[d]` seconds for n micro-batches (pipeline fill and
drain, then one steady-state slot per micro-batch); `rate_split` minimises the latest finish over
integer splits. `resplit` starts from the scheduler's analytic fill and slot (proxy.py) and
corrects them with the ITP of each replica run alone at its share: the analytic view leaves out
communication, bubbles beyond one fill and slow links, which differ between replicas once some
are degraded.
"""

from __future__ import annotations

import heapq

from resihp.core.plan import Plan

from .model import fits_memory, pipeline_key
from .proxy import replica_times


def rate_split(total: int, fill, slot, minimum: int = 1) -> tuple[int, ...]:
    """Micro-batches per replica minimising max_d fill[d] + n_d·slot[d] with Σ n_d = `total` and
    n_d >= `minimum`: each micro-batch in turn goes to the replica that would finish it first (ties:
    lowest index), which is optimal for times increasing in n."""
    n = len(slot)
    if n * minimum > total:
        raise ValueError(f"cannot split {total} micro-batches into {n} replicas of at least {minimum}")
    counts = [minimum] * n
    heap = [(fill[d] + (minimum + 1) * slot[d], d) for d in range(n)]
    heapq.heapify(heap)
    for _ in range(total - n * minimum):
        _, d = heapq.heappop(heap)
        counts[d] += 1
        heapq.heappush(heap, (fill[d] + (counts[d] + 1) * slot[d], d))
    return tuple(counts)


def resplit(ctx, plan: Plan, cluster, alone_s=None, rounds: int = 1, cache: dict | None = None) -> Plan:
    """`plan` with the global batch re-split over its replicas by their rates on `cluster`.

    `alone_s(plan of one replica)` -> seconds (the ITP the caller prices with); each of `rounds`
    scales every replica's analytic (fill, slot) by its ITP alone at the current share over the
    analytic time, then splits again (`rate_split`); without `alone_s` the analytic split alone.
    `cache` (pipeline_key -> seconds) lets calls for several plans on one cluster share passes.
    Returns `plan` itself when the split does not change, when chunks migrate (the split is then
    the migration's to balance), when a stage is hollow, or when the new split does not fit memory
    (more micro-batches can keep more live: all of them under GPipe)."""
    if plan.assignment or plan.dp < 2 or any(st.hollow for r in plan.replicas for st in r):
        return plan
    times = replica_times(ctx, plan, cluster)
    fill, slot = [f for f, _ in times], [s for _, s in times]
    split = rate_split(plan.global_microbatches, fill, slot)
    cache = {} if cache is None else cache
    for _ in range(rounds if alone_s is not None else 0):
        scale = []
        for d, (stages, n) in enumerate(zip(plan.replicas, split)):
            key = pipeline_key(stages, n, cluster)  # replicas alike in structure share one pass
            if key not in cache:
                cache[key] = alone_s(Plan(ctx.model, (stages,), (n,), plan.schedule))
            scale.append(cache[key] / (fill[d] + n * slot[d]))
        new = rate_split(plan.global_microbatches, [f * s for f, s in zip(fill, scale)],
                         [t * s for t, s in zip(slot, scale)])  # fmt: skip
        if new == split:
            break
        split = new
    if split == plan.microbatches:
        return plan
    new = plan.with_changes(microbatches=split)
    return new if fits_memory(ctx, new) else plan
