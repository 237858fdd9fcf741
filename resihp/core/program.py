"""Compile a Plan into per-device instruction lists (the paper's "primitives").

Every member of a TP group runs the same list (TP collectives happen inside F and B), so the
Program stores one ordered list of compute chunks per *group* = (replica, stage), built on first
access (`LazyChunks`), and expands it into full per-device instruction lists (with
RECV/SEND/ALLREDUCE/STEP) on demand. Both the
simulator and the runtime read the same Program: the simulator predicts exactly what runs.

A chunk is (kind, src, j): kind F=0, B=1 (input gradient), W=2 (weight gradient) of micro-batch j
of source replica `src`, at the group's stage. A group's order follows its schedule's template
(`core.schedule`) over the group's micro-batches sorted by (j, src). Plans with migrated chunks
take their orders from a unit-time list-scheduling run instead (`core.listsched`), which is
deadlock-free by construction. Each group's ALLREDUCE names the gradient segments its stage holds
(`core.segments`).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from .listsched import list_schedule
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


class LazyChunks(Mapping):
    """Group -> chunk list, each list built by `build(g)` on first access. A replan reads its
    candidates' Programs through a few groups' arrays (`Program.chunk_array`: the evaluator's
    representatives, every group of a migrated plan), while the runtime and tests read lists."""

    def __init__(self, keys, build) -> None:
        self._keys = dict.fromkeys(keys)
        self._build = build
        self._lists: dict[GroupKey, list[Chunk]] = {}

    def __getitem__(self, g: GroupKey) -> list[Chunk]:
        out = self._lists.get(g)
        if out is None:
            if g not in self._keys:
                raise KeyError(g)
            out = self._lists[g] = self._build(g)
        return out

    def __contains__(self, g) -> bool:
        return g in self._keys

    def __iter__(self):
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


@dataclass(frozen=True)
class Program:
    plan: Plan
    chunks: Mapping[GroupKey, list[Chunk]]  # a dict or `LazyChunks`
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

    def chunk_array(self, g: GroupKey) -> np.ndarray:
        """Group g's chunks as an (n, 3) int64 array of (kind, src, j) rows in program order
        (cached and read-only: the evaluator and the memory check share it)."""
        arrays = self._cache.setdefault("arrays", {})
        a = arrays.get(g)
        if a is None:
            build = self._cache.get("array_of")  # set by the compiler where it is cheaper than the list
            if build is not None:
                a = build(g)
            else:
                chunks = self.chunks[g]
                a = np.fromiter(itertools.chain.from_iterable(chunks), np.int64, 3 * len(chunks))
                a = a.reshape(-1, 3)
            a.setflags(write=False)
            arrays[g] = a
        return a

    def live_peaks(self, groups=None) -> dict[GroupKey, int]:
        """Per group (default: all): most micro-batches holding activations (F done, W not yet) in
        its order. Template orders keep exactly `Schedule.live` (tests/core checks it)."""
        if groups is None:
            if "live" not in self._cache:
                self._cache["live"] = self.live_peaks(list(self.chunks))
            return dict(self._cache["live"])
        groups = list(groups)
        arrays = [self.chunk_array(g) for g in groups]
        sizes = [len(a) for a in arrays]
        kinds = np.concatenate([a[:, 0] for a in arrays] or [np.zeros(0, np.int64)])
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
        native = [(j, d) for j in range(plan.microbatches[d])]
        for i, st in enumerate(stages):
            if not st.hollow:
                out = moved.get((d, i))
                work[(d, i)] = list(native) if out is None else [x for x in native if x[0] not in out]
    arrived = set()
    for src, j, i, dst in plan.assignment:
        work[(dst, i)].append((j, src))
        arrived.add((dst, i))
    for g in arrived:
        work[g].sort()
    return work


def _compile(plan: Plan) -> Program:
    work = _work(plan)
    cache: dict = {}
    if plan.assignment:
        arrays, cache["rounds"] = list_schedule(plan, work)  # rounds: evaluator.dag's level order
        cache["arrays"] = arrays
        chunks = LazyChunks(work, lambda g: list(zip(*arrays[g].T.tolist())))
    else:
        sched = get_schedule(plan.schedule)

        def order(g: GroupKey) -> list[Chunk]:
            return sched.order([(s, j) for j, s in work[g]], g[1], len(plan.replicas[g[0]]))

        def array_of(g: GroupKey) -> np.ndarray:  # the same order, from the template's arrays
            items = np.array(work[g], dtype=np.int64).reshape(-1, 2)  # (j, src) rows, sorted
            kinds, positions = sched.order_arrays(len(items), g[1], len(plan.replicas[g[0]]))
            return np.stack([kinds, items[positions, 1], items[positions, 0]], axis=1)

        chunks = LazyChunks(work, order)
        cache["array_of"] = array_of
    device_group = {dev: g for g in work for dev in plan.replicas[g[0]][g[1]].devices}
    return Program(plan, chunks, device_group, cache)
