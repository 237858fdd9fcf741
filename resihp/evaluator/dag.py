"""The one DAG evaluator of a compiled Program: the paper's iteration-time predictor (eq. 2).

Vertices are the F/B/W chunks of every group in program order. Edges: the previous chunk of the
same group (a device runs one chunk at a time, and a blocking send holds it after the chunk) and
the data dependency (F on F of the previous stage, B on the next stage's chunk after which the
gradient goes upstream, `Schedule.grad_kind`), weighted by the transfer time:

    end(v)  = max(free(prev(v)), end(dep(v)) + edge(v)) + dur(v)
    free(v) = end(v) + send(v)                     (the group is free again; 0 before its first chunk)

Then the gradient sync: segments (`core.segments`) are reduced in layer order; a segment starts
when all its holder groups are free, lasts `segment_s`, and frees them again; each group steps
(`step_s`) after its last segment.

Vectorised three ways. Vertices: each vertex's depth in the DAG (its *level*: the longest chain of
edges reaching it, or the list scheduler's round for migrated plans) is fixed once per Program,
and the vertices of one level do not depend on each other, so a pass is one numpy step per level
(a few hundred for a 1F1B iteration). Replicas: replicas of identical structure (no migration,
same stage and micro-batch counts: the same chunk sequence per stage, whatever their layers and
speeds) form a *unit* that shares one representative's structure, its members on an axis of every
array, so a 16,384-GPU plan costs the structure of one pipeline per class. A batch axis: trailing
columns (iterations, or any family of costs over the same Program), evaluated in the same pass.
A plan with migrated chunks is one unit of one member.

A pipeline in template order (no migration) has a structure that depends on its schedule, its
micro-batch count and its stage count only (`_shape`): its vertices, edges, levels and transfer
pairs up to the replica's index. A replan prices many plans of the same few shapes, so that
structure is built once per shape (a bounded memo of read-only arrays) and each unit of that shape
only adds its members' micro-batch indices.

The arithmetic is the scalar recurrence's, in the same order, so results are bit-identical to a
chunk-by-chunk pass (tests/sim/oracle.py; a test checks equality).
"""

from __future__ import annotations

import numpy as np

from resihp.core.program import B, F, Program
from resihp.core.schedule import get_schedule

GroupKey = tuple[int, int]


# (schedule, micro-batches, stages) -> the finished structure of one pipeline in template order
# (`_Unit.template`): a pure function of those three (bounded; shared read-only by every replica
# class of every plan of that shape). Emptied when it would exceed SHAPES_KEPT shapes or
# SHAPES_VERTICES vertices in all (about 100 bytes each).
_SHAPES: dict[tuple[str, int, int], _Unit] = {}
SHAPES_KEPT = 64
SHAPES_VERTICES = 500_000


class _Unit:
    """One representative's vertices (group-major, program order) and its member replicas."""

    def __init__(self, program: Program, groups: list[GroupKey], members: list[int] | None) -> None:
        plan = program.plan
        self.groups = groups  # the representative's groups (all groups of the plan when migrating)
        self.members = members  # replicas sharing the representative's structure; None: as is
        self.replicas = members if members is not None else [None]
        rows = [program.chunk_array(g) for g in groups]
        sizes = [len(r) for r in rows]
        self.starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        arr = np.concatenate(rows) if rows else np.zeros((0, 3), np.int64)
        kind, src, j = arr[:, 0], arr[:, 1], arr[:, 2]
        gi = np.repeat(np.arange(len(groups)), sizes)
        stage = np.array([g[1] for g in groups], dtype=np.int64)[gi]
        n = len(arr)
        self.n, self.kind, self.gi = n, kind, gi
        self.mb = np.array([plan.mb_offset(d) for d in range(plan.dp)], dtype=np.int64)[src] + j
        self.j = j
        dp, m, p = plan.dp, max(plan.microbatches), max(len(s) for s in plan.replicas)

        def key(k, s, jj, i):
            return ((k * dp + s) * m + jj) * p + i

        vertex_of = np.full(3 * dp * m * p, -1, dtype=np.int64)
        vertex_of[key(kind, src, j, stage)] = np.arange(n)
        last = np.array([len(s) - 1 for s in plan.replicas], dtype=np.int64)[src]
        grad_kind = get_schedule(plan.schedule).grad_kind
        fwd = (kind == F) & (stage > 0)
        bwd = (kind == B) & (stage < last)
        dep = np.full(n, -1, dtype=np.int64)
        dep[fwd] = vertex_of[key(F, src[fwd], j[fwd], stage[fwd] - 1)]
        dep[bwd] = vertex_of[key(grad_kind, src[bwd], j[bwd], stage[bwd] + 1)]
        assert (dep[fwd | bwd] >= 0).all(), "a chunk's data dependency is not in the program"
        self.dep = dep
        # Transfers as indices into `pairs` = unique (from group, to group): in = what the vertex
        # waits for, out = what it sends after it (activation up, gradient down).
        execs = np.broadcast_to(np.arange(dp)[:, None, None], (dp, m, p)).copy()
        for s_, j_, i_, d_ in plan.assignment:
            execs[s_, j_, i_] = d_
        here = np.array([g[0] for g in groups], dtype=np.int64)[gi]
        up = (kind == F) & (stage < last)
        down = (kind == grad_kind) & (stage > 0)
        codes, slots = [], []
        for mask, step, into, slot in ((fwd, -1, True, 0), (bwd, 1, True, 0), (up, 1, False, 1),
                                       (down, -1, False, 1)):  # fmt: skip
            v = np.flatnonzero(mask)
            peer_stage = stage[v] + step
            peer = execs[src[v], j[v], peer_stage] * p + peer_stage
            me = here[v] * p + stage[v]
            codes.append(peer * (dp * p) + me if into else me * (dp * p) + peer)
            slots.append((v, slot))
        uniq, inverse = _unique(np.concatenate(codes), (dp * p) ** 2)
        self.pairs = [((int(a) // p, int(a) % p), (int(b) // p, int(b) % p))
                      for a, b in zip(uniq // (dp * p), uniq % (dp * p))]  # fmt: skip
        self.in_pair = np.full(n, -1, dtype=np.int64)
        self.out_pair = np.full(n, -1, dtype=np.int64)
        at = 0
        for v, slot in slots:
            (self.in_pair if slot == 0 else self.out_pair)[v] = inverse[at : at + len(v)]
            at += len(v)
        rounds = program._cache.get("rounds")  # the list scheduler's rounds: already a level order
        if members is None and rounds is not None:
            self.level = np.concatenate([rounds[g] for g in groups])
        else:
            self.level = self._levels(program)

    @classmethod
    def template(cls, program: Program, members: list[int], offsets: np.ndarray) -> _Unit:
        """The finished unit of `members`, replicas in template order of one shape (their first's
        schedule, micro-batch and stage counts), from the shape's memoised structure: only the
        groups, the transfer pairs' replica and the members' micro-batch indices are its own."""
        plan = program.plan
        d0 = members[0]
        p = len(plan.replicas[d0])
        assert not plan.assignment and not any(st.hollow for d in members for st in plan.replicas[d])
        key = (plan.schedule, plan.microbatches[d0], p)
        shape = _SHAPES.get(key)
        if shape is None:
            shape = cls(program, [(d0, i) for i in range(p)], [d0])
            shape.finish(offsets)
            shape.live = program.live_peaks(shape.groups)
            shape.live = [shape.live[g] for g in shape.groups]
            shape.pairs = [(a[1], b[1]) for a, b in shape.pairs]  # stage pairs: the replica is the unit's
            for a in vars(shape).values():
                if isinstance(a, np.ndarray):
                    a.setflags(write=False)
            held = sum(u.V for u in _SHAPES.values())
            if len(_SHAPES) >= SHAPES_KEPT or held + shape.V > SHAPES_VERTICES:
                _SHAPES.clear()
            _SHAPES[key] = shape
        unit = object.__new__(cls)
        vars(unit).update(vars(shape))
        unit.groups = [(d0, i) for i in range(p)]
        unit.members = unit.replicas = members
        unit.pairs = [((d0, a), (d0, b)) for a, b in shape.pairs]
        unit.mb = shape.j[:, None] + offsets[np.array(members)][None, :]  # (V, members), level order
        return unit

    def finish(self, offsets: np.ndarray) -> None:
        """Sort the vertices by level; member-axis micro-batch indices and transfer pairs."""
        n = self.n
        self.V = n
        small = n == 0 or self.level.max() < 2**16  # a stable sort of 16-bit keys is a radix sort
        order = np.argsort(self.level.astype(np.uint16 if small else np.int32), kind="stable")
        rank = np.empty(n + 1, dtype=np.int64)
        rank[order] = np.arange(n)
        rank[n] = n  # sentinel: free = 0 before a group's first chunk, end = -inf for no dependency
        self.rank = rank
        prev = np.arange(n) - 1
        prev[self.starts[:-1][np.diff(self.starts) > 0]] = -1
        self.prev = rank[np.where(prev >= 0, prev, n)][order]
        self.dep = rank[np.where(self.dep >= 0, self.dep, n)][order]
        self.kind = self.kind[order]
        self.gi = self.gi[order]
        self.j = self.j[order]
        if self.members is None:
            self.mb = self.mb[order][:, None]  # (V, 1)
        else:
            self.mb = self.j[:, None] + offsets[np.array(self.members)][None, :]  # (V, members)
        self.in_pair = self.in_pair[order]
        self.out_pair = self.out_pair[order]
        counts = np.bincount(self.level, minlength=int(self.level.max()) + 1 if n else 0)
        ends = np.cumsum(counts)
        # Per level [s, e): one gather index into run's [end; free] buffer, end[dep] then free[prev].
        first = np.repeat(ends - counts, counts)  # (V,) start of each vertex's level
        gather = np.empty(2 * n, dtype=np.int64)
        gather[np.arange(n) + first] = self.dep
        gather[np.arange(n) + first + np.repeat(counts, counts)] = self.prev + n + 1
        ends = ends.tolist()
        self.levels = [(s, e, gather[2 * s : 2 * e]) for s, e in zip([0] + ends[:-1], ends)]
        self.nonempty = np.diff(self.starts) > 0
        last = np.where(self.nonempty, rank[np.maximum(self.starts[1:] - 1, 0)], n)
        self.last = last  # (groups,) vertex id of each representative group's last chunk

    def member_groups(self) -> list[GroupKey]:
        """Every (member, representative group) as a group key, member-major."""
        return [g if d is None else (d, g[1]) for d in self.replicas for g in self.groups]

    def member_pairs(self, r: int) -> list[tuple[GroupKey, GroupKey]]:
        """The transfer pairs of member r (the representative's, moved to its replica)."""
        d = self.replicas[r]
        return [p if d is None else ((d, p[0][1]), (d, p[1][1])) for p in self.pairs]

    def _levels(self, program: Program) -> np.ndarray:
        """Longest edge chain reaching each vertex; AssertionError naming the stuck chunks when
        the orders wait on each other in a cycle (a deadlocking Program)."""
        dep = self.dep.tolist()
        level = [-1] * self.n
        bounds = list(zip(self.starts[:-1].tolist(), self.starts[1:].tolist()))
        pos = [a for a, _ in bounds]
        remaining = self.n
        while remaining:
            progressed = False
            for gi, (a, b) in enumerate(bounds):
                k = k0 = pos[gi]
                prev = level[k - 1] if k > a else -1
                while k < b:
                    d = dep[k]
                    if d >= 0:
                        ld = level[d]
                        if ld < 0:
                            break
                        if ld > prev:
                            prev = ld
                    prev += 1
                    level[k] = prev
                    k += 1
                if k > k0:
                    remaining -= k - k0
                    pos[gi] = k
                    progressed = True
            if not progressed:
                stuck = {
                    g: program.chunks[g][pos[gi] - a]
                    for gi, (g, (a, b)) in enumerate(zip(self.groups, bounds))
                    if pos[gi] < b
                }
                raise AssertionError(f"program deadlocks; next chunks per group: {stuck}")
        return np.array(level, dtype=np.int64)


def _unique(codes: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(codes, return_inverse=True)` for codes in [0, bound): by a presence mask when
    the bound is small next to the codes (no sort)."""
    if bound > 4 * len(codes) + 4096:
        return np.unique(codes, return_inverse=True)
    present = np.zeros(bound, dtype=bool)
    present[codes] = True
    return np.flatnonzero(present), (np.cumsum(present) - 1)[codes]


class Dag:
    """Cost-independent, level-sorted structure of one Program (cached on it by `of`).

    `units`: the replica classes (`Unit`). `groups`: every non-hollow group of the plan; for a
    group g, `where[g]` = (unit index, member index, representative group index) or None for a
    group without chunks. Times of unit u are arrays (V_u (+1), members_u, *batch).
    """

    @classmethod
    def of(cls, program: Program) -> Dag:
        if "dag" not in program._cache:
            program._cache["dag"] = cls(program)
        return program._cache["dag"]

    def __init__(self, program: Program) -> None:
        self.units = self._units(program)
        self.groups: list[GroupKey] = []
        self.where: dict[GroupKey, tuple[int, int, int] | None] = {}
        for k, u in enumerate(self.units):
            for r, d in enumerate(u.replicas):
                for q, g in enumerate(u.groups):
                    key = g if d is None else (d, g[1])
                    self.where[key] = (k, r, q)
                    self.groups.append(key)
        for g in program.chunks:  # groups without chunks (a replica with no micro-batches)
            if g not in self.where:
                self.where[g] = None
                self.groups.append(g)
        self.group_index = {g: k for k, g in enumerate(self.groups)}
        migrating = len(self.units) == 1 and self.units[0].members is None
        live = program.live_peaks() if migrating else None
        self.live_peak = {
            g: 0 if w is None else (live[g] if migrating else self.units[w[0]].live[w[2]])
            for g, w in self.where.items()
        }  # members share their representative's order
        holders = [np.array([self.group_index[h] for h in seg.groups]) for seg in program.segments]
        self.segments = list(zip([seg.layers for seg in program.segments], holders))

    def _units(self, program: Program) -> list[_Unit]:
        """Replica classes of identical structure, or the whole plan as one unit when it migrates."""
        plan = program.plan
        offsets = np.array([plan.mb_offset(d) for d in range(plan.dp)], dtype=np.int64)
        if plan.assignment:
            unit = _Unit(program, [g for g in program.chunks if len(program.chunk_array(g))], None)
            unit.finish(offsets)
            return [unit]
        classes: dict[tuple[int, int], list[int]] = {}
        for d, stages in enumerate(plan.replicas):
            if plan.microbatches[d]:
                classes.setdefault((len(stages), plan.microbatches[d]), []).append(d)
        return [_Unit.template(program, members, offsets) for members in classes.values()]

    def vertices(self, g: GroupKey) -> tuple[int, int, np.ndarray]:
        """(unit, member, vertex ids in program order) of group g's chunks; (-1, -1, []) for none."""
        w = self.where[g]
        if w is None:
            return -1, -1, np.zeros(0, dtype=np.int64)
        u = self.units[w[0]]
        return w[0], w[1], u.rank[u.starts[w[2]] : u.starts[w[2] + 1]]

    # ------------------------------------------------------------------ evaluation
    def run(self, lanes) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per unit, (end, free), each (V + 1, members, *batch), from per-unit (dur, edge, send)
        arrays (V, members, *batch) in vertex order (row V: the sentinel)."""
        out = []
        maximum, add = np.maximum, np.add
        for u, (dur, edge, send) in zip(self.units, lanes):
            n = u.V
            both = np.empty((2 * (n + 1), *dur.shape[1:]))  # [end; free], each with its sentinel row
            end, free = both[: n + 1], both[n + 1 :]
            end[n] = -np.inf
            free[n] = 0.0
            take = both.take
            for s, e, gather in u.levels:
                got = take(gather, axis=0)  # end[dep] (first e - s rows), free[prev] (the rest)
                t = got[: e - s]
                t += edge[s:e]
                t_end = end[s:e]
                maximum(got[e - s :], t, out=t_end)  # written in place: no copy into `end`
                t_end += dur[s:e]
                add(t_end, send[s:e], out=free[s:e])
            out.append((end, free))
        return out

    def sync(self, frees: list[np.ndarray], segment_s, step_s) -> np.ndarray:
        """(groups, *batch) time each group has stepped: its segments reduced in layer order after
        its last chunk (per-unit `free` arrays of `run`), each segment starting once every holder
        is free. `segment_s`: layers -> seconds."""
        batch = frees[0].shape[2:] if frees else ()
        t = np.zeros((len(self.groups), *batch))
        at = 0
        for u, free in zip(self.units, frees):
            n = len(u.replicas) * len(u.groups)
            t[at : at + n] = free[u.last].swapaxes(0, 1).reshape(n, *batch)  # member-major
            at += n
        for layers, holders in self.segments:
            t[holders] = t[holders].max(axis=0) + segment_s.get(layers, 0.0)
        return t + step_s

    def group_sums(self, values: list[np.ndarray]) -> np.ndarray:
        """(groups, *batch) sums over each group's chunks (program order) of per-unit (V, members,
        *batch) `values`."""
        batch = values[0].shape[2:] if values else ()
        out = np.zeros((len(self.groups), *batch))
        at = 0
        for u, val in zip(self.units, values):
            major = val[u.rank[: u.V]]  # (V, members, *batch) in group-major program order
            sums = np.add.reduceat(major, u.starts[:-1][u.nonempty], axis=0)  # (groups_u', members, ...)
            full = np.zeros((len(u.groups), *major.shape[1:]))
            full[u.nonempty] = sums
            n = len(u.replicas) * len(u.groups)
            out[at : at + n] = full.swapaxes(0, 1).reshape(n, *batch)
            at += n
        return out
