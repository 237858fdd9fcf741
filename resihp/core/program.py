"""Compile a Plan into per-device instruction lists (the paper's "primitives").

Every member of a TP group runs the same list (TP collectives happen inside F and B), so the
Program stores one ordered list of compute chunks per *group* = (replica, stage) and expands it
into full per-device instruction lists (with RECV/SEND/ALLREDUCE/STEP) on demand. Both the
simulator and the runtime read the same Program: the simulator predicts exactly what runs.

A chunk is (kind, src, j): kind F=0, B=1 (input gradient), W=2 (weight gradient) of micro-batch j
of source replica `src`, at the group's stage. A group's order follows its schedule's template
(`core.schedule`) over the group's micro-batches sorted by (j, src). Plans with migrated chunks
take their orders from a unit-time list-scheduling run instead (`_greedy_orders`), which is
deadlock-free by construction. Each group's ALLREDUCE names the gradient segments its stage holds
(`core.segments`).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from .plan import Plan
from .schedule import KIND_NAMES, B, Chunk, F, W, get_schedule
from .segments import GradSegment, grad_segments

__all__ = ["B", "F", "KIND_NAMES", "W", "Chunk", "GroupKey", "Instr", "Program", "compile_plan"]
GroupKey = tuple[int, int]  # (replica, stage)


@dataclass(frozen=True)
class Instr:
    """One primitive. `op` in F, B, W, SEND, RECV, ALLREDUCE, STEP.

    For SEND/RECV, `what` is "act" or "grad" and `peer` the (replica, stage) group at the other end.
    For ALLREDUCE, `peer` is None and `segments` are the gradient segments the stage holds, in layer
    order: each is reduced with its other holders (`GradSegment.reduce_set`).
    """

    op: str
    src: int = -1
    mb: int = -1
    stage: int = -1
    what: str = ""
    peer: GroupKey | None = None
    segments: tuple[GradSegment, ...] = ()


@dataclass(frozen=True)
class Program:
    plan: Plan
    chunks: dict[GroupKey, list[Chunk]]
    _device_group: dict[int, GroupKey] = field(default_factory=dict, repr=False)
    _cache: dict = field(default_factory=dict, repr=False, compare=False)  # derived, e.g. sim structure

    def group_of(self, device: int) -> GroupKey:
        return self._device_group[device]

    def devices(self, g: GroupKey) -> tuple[int, ...]:
        return self.plan.replicas[g[0]][g[1]].devices

    @property
    def segments(self) -> tuple[GradSegment, ...]:
        """The plan's gradient segments, in layer order."""
        if "segments" not in self._cache:
            self._cache["segments"] = grad_segments(self.plan)
        return self._cache["segments"]

    def segments_of(self, g: GroupKey) -> tuple[GradSegment, ...]:
        """The segments group g holds (and reduces at its ALLREDUCE), in layer order."""
        return tuple(seg for seg in self.segments if g in seg.groups)

    def live_peaks(self, groups=None) -> dict[GroupKey, int]:
        """Per group (default: all): most micro-batches holding activations (F done, W not yet) in
        its order. Template orders keep exactly `Schedule.live` (tests/core checks it)."""
        if groups is None:
            if "live" not in self._cache:
                self._cache["live"] = self.live_peaks(list(self.chunks))
            return dict(self._cache["live"])
        groups = list(groups)
        sizes = [len(self.chunks[g]) for g in groups]
        kinds = np.fromiter((c[0] for g in groups for c in self.chunks[g]), np.int64, sum(sizes))
        held = np.cumsum((kinds == F).astype(np.int64) - (kinds == W))
        starts = np.cumsum([0] + sizes[:-1]) if groups else np.zeros(0, np.int64)
        base = np.where(starts > 0, held[np.maximum(starts - 1, 0)], 0) if len(held) else starts
        out = {}
        nonempty = [k for k, n in enumerate(sizes) if n]
        if nonempty:
            peaks = np.maximum.reduceat(held, starts[nonempty]) - base[nonempty]
            out = dict(zip((groups[k] for k in nonempty), np.maximum(peaks, 0).tolist()))
        return {g: out.get(g, 0) for g in groups}

    def instructions(self, device: int) -> list[Instr]:
        """The full ordered primitive list of one device."""
        plan = self.plan
        d, i = g = self.group_of(device)
        last = {src: len(plan.replicas[src]) - 1 for src in range(plan.dp)}
        grad_kind = get_schedule(plan.schedule).grad_kind
        out: list[Instr] = []
        for kind, src, j in self.chunks[g]:
            if kind == F:
                if i > 0:
                    out.append(Instr("RECV", src, j, i, "act", (plan.executor(src, j, i - 1), i - 1)))
                out.append(Instr("F", src, j, i))
                if i < last[src]:
                    out.append(Instr("SEND", src, j, i, "act", (plan.executor(src, j, i + 1), i + 1)))
            elif kind == B:
                if i < last[src]:
                    out.append(Instr("RECV", src, j, i, "grad", (plan.executor(src, j, i + 1), i + 1)))
                out.append(Instr("B", src, j, i))
            else:
                out.append(Instr("W", src, j, i))
            if kind == grad_kind and i > 0:
                out.append(Instr("SEND", src, j, i, "grad", (plan.executor(src, j, i - 1), i - 1)))
        out.append(Instr("ALLREDUCE", stage=i, segments=self.segments_of(g)))
        out.append(Instr("STEP", stage=i))
        del d
        return out


def _greedy_orders(plan: Plan, work: dict[GroupKey, list[tuple[int, int]]]) -> tuple[dict, dict]:
    """Orders for plans with migrated chunks, read off a unit-time list-scheduling run, and the
    round each chunk started in (a topological numbering of the Program's DAG: a chunk's
    predecessors all started in earlier rounds).

    Static templates cannot be merged safely when a group serves several source pipelines (its
    1F1B steady state is offset against theirs and the orders can wait on each other in a cycle).
    Instead every group, whenever idle, starts a ready chunk of the kind the schedule prefers
    (`Schedule.list_preference`; 1F1B: a B first, its W right after): an F only while fewer of
    *that source pipeline's* micro-batches are live than the schedule's template would keep live
    for that source's micro-batches at this stage (`Schedule.live`); ties go to the lowest
    (micro-batch, source). The per-source limit lets migrated-in work fill its own pipeline (one
    shared limit starves both pipelines); the extra live activations are the memory cost of
    migration, which the simulator reports in its peak memory (and the scheduler's memory check
    reads off the compiled Program). The orders are an actual execution, so the Program is
    deadlock-free under any timing.
    """
    sched = get_schedule(plan.schedule)
    dp = plan.dp
    last = [len(st) - 1 for st in plan.replicas]
    keys = list(work)
    index = {g: k for k, g in enumerate(keys)}
    # A chunk's (j, src) is coded c = j * dp + src: ints order as the (j, src) tuples do.
    # at[src][i][j]: index of the group that runs stage i of (src, j).
    at = [
        [[index.get((src, i), -1)] * plan.microbatches[src] for i in range(len(stages))]
        for src, stages in enumerate(plan.replicas)
    ]
    for (src, j, i), d in plan._exec.items():
        at[src][i][j] = index[(d, i)]
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
    ready_b: list[list[int]] = [[] for _ in keys]
    ready_w: list[list[int]] = [[] for _ in keys]
    grad_kind = sched.grad_kind
    one_f_one_b = sched.list_w_follows_b
    # 1F1B runs each W right after its B (`forced`), so W is never picked on its own there.
    preference = sched.list_preference
    orders: list[list[Chunk]] = [[] for _ in keys]
    rounds: list[list[int]] = [[] for _ in keys]
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
    while done < total:
        ran_f: list[tuple[int, int, int, int]] = []  # (group, code, src, j) per kind run this round
        ran_b: list[tuple[int, int, int, int]] = []
        ran_w: list[tuple[int, int, int, int]] = []
        idle = False
        for k in active:
            c = forced[k]
            if c >= 0:
                forced[k] = -1  # 1F1B: the W of the B just run (never queued)
                kind, ran = W, ran_w
                by_src[k][c % dp][1] -= 1
            else:
                for kd in preference:
                    if kd == B:
                        heap = ready_b[k]
                        if heap:
                            kind, ran = B, ran_b
                            c = heappop(heap)
                            if one_f_one_b:
                                forced[k] = c
                            break
                    elif kd == F:
                        c = -1  # the ready F of lowest code whose source has room
                        for rec in recs[k]:
                            h = rec[0]
                            if h and rec[1] < rec[2] and (c < 0 or h[0] < c):
                                c, room = h[0], rec
                        if c >= 0:
                            kind, ran = F, ran_f
                            heappop(room[0])
                            room[1] += 1
                            break
                    else:
                        heap = ready_w[k]
                        if heap:
                            kind, ran = W, ran_w
                            c = heappop(heap)
                            by_src[k][c % dp][1] -= 1
                            break
                else:
                    on[k] = False
                    idle = True
                    continue
            j, src = divmod(c, dp)
            orders[k].append((kind, src, j))
            rounds[k].append(now)
            ran.append((k, c, src, j))
        ran_n = len(ran_f) + len(ran_b) + len(ran_w)
        assert ran_n, "list scheduling stalled: no group could start a chunk"
        done += ran_n
        now += 1
        if idle:
            active = [k for k in active if on[k]]
        for k, c, src, j in ran_f:
            i = stage[k] + 1
            if i <= last[src]:
                t = at[src][i][j]
                heappush(by_src[t][src][0], c)
                if not on[t]:
                    on[t] = True
                    active.append(t)
            else:
                heappush(ready_b[k], c)  # k runs every stage-i chunk of (src, j)
        if not one_f_one_b:
            for k, c, _, _ in ran_b:
                heappush(ready_w[k], c)
        for k, c, src, j in ran_b if grad_kind == B else ran_w:
            i = stage[k] - 1
            if i >= 0:
                t = at[src][i][j]
                heappush(ready_b[t], c)
                if not on[t]:
                    on[t] = True
                    active.append(t)
    orders = dict(zip(keys, orders))
    rounds = dict(zip(keys, rounds))
    return orders, rounds


_COMPILED: OrderedDict[tuple, Program] = OrderedDict()  # memo of compile_plan by layout, newest last
MEMO_CHUNKS = 2_000_000  # most chunks the memo keeps (about 100 MB of Programs)


def compile_plan(plan: Plan) -> Program:
    """Per-group ordered chunk lists for `plan.schedule`.

    Memoised (a pure function of the Plan; a bounded LRU of recent Programs): the scheduler's
    memory check, every sampled iteration of the job simulator and the policies' predictions of
    one candidate then share one Program and the evaluator structure cached on it. Plans that
    differ only in generation or standby devices share the compiled layout."""
    key = (plan.model, plan.replicas, plan.microbatches, plan.schedule, plan.assignment)
    hit = _COMPILED.get(key)
    if hit is not None:
        _COMPILED.move_to_end(key)
        return hit if hit.plan is plan else Program(plan, hit.chunks, hit._device_group, hit._cache)
    program = _compile(plan)
    _COMPILED[key] = program
    total = sum(_size(p) for p in _COMPILED.values())
    while len(_COMPILED) > 1 and (len(_COMPILED) > 16 or total > MEMO_CHUNKS):
        _, old = _COMPILED.popitem(last=False)
        total -= _size(old)
    return program


def forget_compiled() -> None:
    """Empty the compile_plan memo (a benchmark timing cold compiles calls this)."""
    _COMPILED.clear()


def _size(program: Program) -> int:
    return 3 * program.plan.global_microbatches * max(len(s) for s in program.plan.replicas)


def _work(plan: Plan) -> dict[GroupKey, list[tuple[int, int]]]:
    """Per non-hollow group (replica, stage), in plan order: the (j, src) micro-batches it runs
    at its stage, sorted."""
    moved: dict[tuple[int, int], set[int]] = {}  # (src, stage) -> micro-batches run elsewhere
    for src, j, i, _ in plan.assignment:
        moved.setdefault((src, i), set()).add(j)
    work: dict[GroupKey, list[tuple[int, int]]] = {}
    for d, stages in enumerate(plan.replicas):
        m = plan.microbatches[d]
        for i, st in enumerate(stages):
            if not st.hollow:
                out = moved.get((d, i))
                work[(d, i)] = [(j, d) for j in range(m) if out is None or j not in out]
    arrived = set()
    for src, j, i, dst in plan.assignment:
        work[(dst, i)].append((j, src))
        arrived.add((dst, i))
    for g in arrived:
        work[g].sort()
    return work


def _compile(plan: Plan) -> Program:
    work = _work(plan)
    rounds = None
    if plan.assignment:
        chunks, rounds = _greedy_orders(plan, work)
    else:
        sched = get_schedule(plan.schedule)
        chunks = {
            g: sched.order([(s, j) for j, s in items], g[1], len(plan.replicas[g[0]]))
            for g, items in work.items()
        }
    device_group = {dev: g for g in work for dev in plan.replicas[g[0]][g[1]].devices}
    program = Program(plan, chunks, device_group)
    if rounds is not None:
        program._cache["rounds"] = rounds  # the evaluator's level order (sim.dag)
    return program
