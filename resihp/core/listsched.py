"""The list scheduler that orders the chunks of plans with migrated work (`program.compile_plan`).

Static templates cannot be merged safely when a group serves several source pipelines (its 1F1B
steady state is offset against theirs and the orders can wait on each other in a cycle). Instead
a unit-time list-scheduling run decides: in every round, every group that is idle starts a ready
chunk of the kind the schedule prefers (`Schedule.list_preference`; 1F1B: a B first, its W right
after): an F only while fewer of *that source pipeline's* micro-batches are live than the
schedule's template would keep live for that source's micro-batches at this stage
(`Schedule.live`); ties go to the lowest (micro-batch, source). The per-source limit lets
migrated-in work fill its own pipeline (one shared limit starves both pipelines); the extra live
activations are the memory cost of migration, which the simulator reports in its peak memory (and
the scheduler's memory check reads off the compiled Program). The orders are an actual execution,
so the Program is deadlock-free under any timing, and the round each chunk started in is a
topological numbering of the Program's DAG (a chunk's predecessors all started in earlier rounds):
the evaluator's level order (`evaluator.dag`).

Groups only ever wait on groups that share a source replica's chunks with them, so the run is
made per *component* (replicas joined by the assignment's moves): each component's orders and
rounds are the ones the joint run gives. A replica no move touches is a template-shaped pipeline
whose run depends only on (schedule, stages, micro-batches): that run is memoised by shape
(`_plain`) and relabelled for every such replica (a migrated plan usually moves work between a few
replicas and leaves the rest alone).

Inside the run a chunk (j, src) is coded c = j * dp + src (ints order as the (j, src) tuples do)
and each started chunk is recorded as one int, (round * 3 + kind) * C + c, decoded with numpy at
the end into the (kind, src, j) arrays and the rounds (the Program builds chunk tuples on demand).
"""

from __future__ import annotations

import heapq
import itertools
from functools import lru_cache

import numpy as np

from .model_spec import ModelSpec
from .plan import Plan
from .schedule import B, F, W, get_schedule

GroupKey = tuple[int, int]  # (replica, stage)
assert (F, B, W) == (0, 1, 2), "the recorded starts code the kind as 0, 1, 2"
# Any model will do for `_plain`'s one-replica plan: the run reads only the plan's shape.
_SHAPE_MODEL = ModelSpec("shape", 1 << 12, 64, 1, 1, 64, 64)


def list_schedule(plan: Plan, work: dict[GroupKey, list[tuple[int, int]]]) -> tuple[dict, dict]:
    """(arrays, rounds) per group of `work` (each group's sorted (j, src) micro-batches): its
    chunks in start order as a read-only (n, 3) int64 array of (kind, src, j) rows, and the round
    each chunk started in (int64 array). Run per component of replicas the moves join (`_run`),
    replicas no move touches from the memo by shape (`_plain`)."""
    root = list(range(plan.dp))  # union-find over replicas: a move joins its source and executor

    def find(d: int) -> int:
        while root[d] != d:
            d = root[d]
        return d

    for src, _, _, dst in plan.assignment:
        root[find(src)] = find(dst)
    touched = {a[0] for a in plan.assignment} | {a[3] for a in plan.assignment}
    parts: dict[int, dict[GroupKey, list[tuple[int, int]]]] = {}
    for g, items in work.items():
        parts.setdefault(find(g[0]), {})[g] = items
    arrays: dict = {}
    rounds: dict = {}
    for top, part in parts.items():
        if top in touched or not plan.microbatches[top]:
            got = _run(plan, part)
        else:
            got = _relabel(_plain(plan.schedule, len(plan.replicas[top]), plan.microbatches[top]), top)
        arrays.update(got[0])
        rounds.update(got[1])
    return {g: arrays[g] for g in work}, {g: rounds[g] for g in work}


@lru_cache(maxsize=16)
def _plain(schedule: str, num_stages: int, m: int) -> tuple[list, list]:
    """The run of one replica of `num_stages` stages and `m` micro-batches that no move touches,
    as replica 0: per stage, its (n, 3) chunk array and its rounds (read-only)."""
    plan = Plan.uniform(_SHAPE_MODEL, 1, num_stages, 1, m, schedule=schedule)
    arrays, rounds = _run(plan, {(0, i): [(j, 0) for j in range(m)] for i in range(num_stages)})
    return [arrays[(0, i)] for i in range(num_stages)], [rounds[(0, i)] for i in range(num_stages)]


def _relabel(shape: tuple[list, list], d: int) -> tuple[dict, dict]:
    """`_plain`'s run as replica d's: its groups, the source column d."""
    arrays, rounds = {}, {}
    for i, (a, r) in enumerate(zip(*shape)):
        if d:
            a = a.copy()
            a[:, 1] = d
            a.setflags(write=False)
        arrays[(d, i)] = a
        rounds[(d, i)] = r
    return arrays, rounds


def _run(plan: Plan, work: dict[GroupKey, list[tuple[int, int]]]) -> tuple[dict, dict]:
    """`list_schedule` of the groups of `work` run together: chunks of sources outside it never
    reach them (one component, or the whole plan)."""
    sched = get_schedule(plan.schedule)
    dp = plan.dp
    keys = list(work)
    index = {g: k for k, g in enumerate(keys)}
    at = _executors(plan, index)
    w1 = max(len(st) for st in plan.replicas) + 1  # at[c * w1 + i]: the group of stage i of chunk c
    # Per group: one record [heap of ready F codes, live count, live limit] per source replica
    # (`recs`, and `by_src` by source index); B and W ready chunks as heaps of codes.
    recs: list[list[list]] = []
    by_src: list[list] = []
    for g, items in work.items():
        count: dict[int, int] = {}
        for _, src in items:
            count[src] = count.get(src, 0) + 1
        p = len(plan.replicas[g[0]])
        own = {src: [[], 0, sched.live(n, g[1], p)] for src, n in count.items()}
        if g[1] == 0:
            for j, src in items:  # sorted by (j, src): each heap is a sorted list
                own[src][0].append(j * dp + src)
        recs.append(list(own.values()))
        by_src.append([own.get(src) for src in range(dp)])
    n = len(keys)
    C = dp * max(plan.microbatches)  # codes are < C
    ready_b: list[list[int]] = [[] for _ in keys]
    ready_w: list[list[int]] = [[] for _ in keys]
    grad_kind = sched.grad_kind
    one_f_one_b = sched.list_w_follows_b
    # 1F1B runs each W right after its B (`forced`), so W is never picked on its own there.
    preference = sched.list_preference
    started: list[list[int]] = [[] for _ in keys]  # per group: (round * 3 + kind) * C + code
    forced = [-1] * n
    stage = [g[1] for g in keys]
    total = sum(3 * len(v) for v in work.values())
    done = now = 0
    heappush, heappop = heapq.heappush, heapq.heappop

    # Groups that may have work (every group with a chunk it could start is in it); `on` marks them.
    active = [k for k in range(n) if stage[k] == 0]
    on = [False] * n
    for k in active:
        on[k] = True
    # A B has effects at the end of its round only when its W is queued or the gradient leaves
    # after it; under 1F1B (W forced right after B, gradient after W) it has none, only a count.
    track_b = not one_f_one_b or grad_kind == B
    while done < total:
        ran_f: list[tuple[int, int]] = []  # (group, code) per kind run this round
        ran_b: list[tuple[int, int]] = []
        ran_w: list[tuple[int, int]] = []
        n_b = 0  # untracked Bs run this round
        idle = False
        at_f = now * 3 * C  # the recorded start of chunk code c of kind K this round is at_K + c
        at_b = at_f + C
        at_w = at_b + C
        for k in active:
            c = forced[k]
            if c >= 0:
                forced[k] = -1  # 1F1B: the W of the B just run (never queued)
                by_src[k][c % dp][1] -= 1
                started[k].append(at_w + c)
                ran_w.append((k, c))
                continue
            for kd in preference:
                if kd == B:
                    heap = ready_b[k]
                    if heap:
                        c = heappop(heap)
                        if one_f_one_b:
                            forced[k] = c
                        started[k].append(at_b + c)
                        if track_b:
                            ran_b.append((k, c))
                        else:
                            n_b += 1
                        break
                elif kd == F:
                    c = -1  # the ready F of lowest code whose source has room
                    for rec in recs[k]:
                        h = rec[0]
                        if h and rec[1] < rec[2] and (c < 0 or h[0] < c):
                            c, room = h[0], rec
                    if c >= 0:
                        heappop(room[0])
                        room[1] += 1
                        started[k].append(at_f + c)
                        ran_f.append((k, c))
                        break
                else:
                    heap = ready_w[k]
                    if heap:
                        c = heappop(heap)
                        by_src[k][c % dp][1] -= 1
                        started[k].append(at_w + c)
                        ran_w.append((k, c))
                        break
            else:
                on[k] = False
                idle = True
        ran_n = len(ran_f) + len(ran_b) + len(ran_w) + n_b
        assert ran_n, "list scheduling stalled: no group could start a chunk"
        done += ran_n
        now += 1
        if idle:
            active = [k for k in active if on[k]]
        for k, c in ran_f:
            t = at[c * w1 + stage[k] + 1]
            if t >= 0:
                heappush(by_src[t][c % dp][0], c)
                if not on[t]:
                    on[t] = True
                    active.append(t)
            else:  # the last stage: k runs every stage of (src, j) from here
                heappush(ready_b[k], c)
        if not one_f_one_b:
            for k, c in ran_b:
                heappush(ready_w[k], c)
        for k, c in ran_b if grad_kind == B else ran_w:
            t = at[c * w1 + stage[k] - 1]  # -1 at stage 0 (the previous chunk's padding slot)
            if t >= 0:
                heappush(ready_b[t], c)
                if not on[t]:
                    on[t] = True
                    active.append(t)
    return _decode(keys, started, C, dp)


def _executors(plan: Plan, index: dict[GroupKey, int]) -> list[int]:
    """Flat table of executor groups: entry c * w1 + i (w1 = most stages + 1) is the index in
    `index` of the group running stage i of chunk c = j * dp + src, -1 past src's last stage (the
    padding slot w1 - 1 too, so stage -1 of chunk c reads chunk c - 1's padding: -1). Chunks of a
    source outside the component of `index` (a move whose executor is not in it) are -1 as well:
    they never reach its groups."""
    dp, m = plan.dp, max(plan.microbatches)
    w1 = max(len(st) for st in plan.replicas) + 1
    at = np.full((m, dp, w1), -1, dtype=np.int64)  # [j, src, i]: flat index (j * dp + src) * w1 + i
    for src, stages in enumerate(plan.replicas):
        for i in range(len(stages)):
            at[: plan.microbatches[src], src, i] = index.get((src, i), -1)
    for (src, j, i), d in plan._exec.items():
        at[j, src, i] = index.get((d, i), -1)
    return at.ravel().tolist()


def _decode(keys: list[GroupKey], started: list[list[int]], C: int, dp: int) -> tuple[dict, dict]:
    """The recorded starts as (n, 3) arrays and rounds per group (numpy, one pass)."""
    sizes = [len(s) for s in started]
    flat = np.fromiter(itertools.chain.from_iterable(started), np.int64, sum(sizes))
    slot, code = np.divmod(flat, C)
    rounds, kind = np.divmod(slot, 3)
    j, src = np.divmod(code, dp)
    table = np.stack([kind, src, j], axis=1)  # (N, 3)
    table.setflags(write=False)
    rounds.setflags(write=False)
    arrays, by_round = {}, {}
    at = 0
    for g, size in zip(keys, sizes):
        arrays[g] = table[at : at + size]
        by_round[g] = rounds[at : at + size]
        at += size
    return arrays, by_round
