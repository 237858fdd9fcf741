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

Two axes are vectorised. Vertices: each vertex's depth in the DAG (its *level*, the longest chain
of edges reaching it) is computed once per Program, and the vertices of one level do not depend on
each other, so a pass is one numpy step per level (a few hundred for a 1F1B iteration) over that
level's vertices of every replica at once. A batch axis: every time array has trailing batch
columns (iterations, or any family of costs over the same Program), evaluated in the same pass.
Replicas of identical structure (no migration, same stage and micro-batch counts: the same chunk
sequence per stage, whatever their layers and speeds) share one representative's structure,
tiled, so a 16,384-GPU plan costs the Python work of one pipeline per class.

The arithmetic is the scalar recurrence's, in the same order, so results are bit-identical to a
chunk-by-chunk pass (tests/sim/oracle.py; a test checks equality).
"""

from __future__ import annotations

import itertools

import numpy as np

from resihp.core.program import B, F, Program
from resihp.core.schedule import get_schedule

GroupKey = tuple[int, int]


class _Unit:
    """One representative's vertices (group-major, program order) and its member replicas."""

    def __init__(self, program: Program, groups: list[GroupKey], members: list[int] | None) -> None:
        plan = program.plan
        self.groups = groups
        self.members = members  # replicas sharing the representative's structure; None: as is
        rows = [
            np.fromiter(itertools.chain.from_iterable(program.chunks[g]), np.int64).reshape(-1, 3)
            for g in groups
        ]
        sizes = [len(r) for r in rows]
        self.starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        arr = np.concatenate(rows) if rows else np.zeros((0, 3), np.int64)
        kind, src, j = arr[:, 0], arr[:, 1], arr[:, 2]
        gi = np.repeat(np.arange(len(groups)), sizes)
        stage = np.array([g[1] for g in groups], dtype=np.int64)[gi]
        n = len(arr)
        self.n, self.kind, self.gi = n, kind, gi
        self.mb = np.array([plan.mb_offset(d) for d in range(plan.dp)], dtype=np.int64)[src] + j
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
        uniq, inverse = np.unique(np.concatenate(codes), return_inverse=True)
        self.pairs = [((int(a) // p, int(a) % p), (int(b) // p, int(b) % p))
                      for a, b in zip(uniq // (dp * p), uniq % (dp * p))]  # fmt: skip
        self.in_pair = np.full(n, -1, dtype=np.int64)
        self.out_pair = np.full(n, -1, dtype=np.int64)
        at = 0
        for v, slot in slots:
            (self.in_pair if slot == 0 else self.out_pair)[v] = inverse[at : at + len(v)]
            at += len(v)
        self.level = self._levels(program)

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


class Dag:
    """Cost-independent, level-sorted structure of one Program (cached on it by `of`).

    Vertex ids are in level order. Per vertex: `gidx` (index into `groups`), `kind`, `mb` (global
    micro-batch index), `prev` / `dep` (vertex ids; `V` is a sentinel), `in_pair` / `out_pair`
    (indices into `pairs`, -1 for none). `vertices(g)`: group g's vertex ids in program order.
    """

    @classmethod
    def of(cls, program: Program) -> Dag:
        if "dag" not in program._cache:
            program._cache["dag"] = cls(program)
        return program._cache["dag"]

    def __init__(self, program: Program) -> None:
        plan = program.plan
        units = self._units(program)
        groups: list[GroupKey] = []
        pairs: list[tuple[GroupKey, GroupKey]] = []
        names = ("gidx", "kind", "mb", "dep", "prev", "level", "in", "out")
        parts: dict[str, list[np.ndarray]] = {k: [] for k in names}
        sizes: list[np.ndarray] = []  # chunks per group, in `groups` order (pre-sort ids are group-major)
        base = 0
        offsets = np.array([plan.mb_offset(d) for d in range(plan.dp)], dtype=np.int64)
        for u in units:
            members = u.members if u.members is not None else [None]
            r = len(members)
            rep = u.groups[0][0]
            for d in members:
                groups += [g if d is None else (d, g[1]) for g in u.groups]
                pairs += [p if d is None else ((d, p[0][1]), (d, p[1][1])) for p in u.pairs]
            copies = np.arange(r, dtype=np.int64)[:, None]  # (r, 1)
            shift = (copies * u.n + base).ravel()  # vertex id of each copy's first vertex
            group_base = len(groups) - r * len(u.groups)
            pair_base = len(pairs) - r * len(u.pairs)
            mb = u.mb[None, :].repeat(r, 0)
            if u.members is not None:
                mb = mb - offsets[rep] + offsets[np.array(u.members)][:, None]
            prev = np.arange(u.n) - 1
            prev[u.starts[:-1][np.diff(u.starts) > 0]] = -1
            pair_of = pair_base + copies * len(u.pairs)
            columns = {
                "gidx": group_base + copies * len(u.groups) + u.gi[None, :],
                "kind": np.broadcast_to(u.kind, (r, u.n)),
                "mb": mb,
                "dep": np.where(u.dep >= 0, u.dep[None, :] + shift[:, None], -1),
                "prev": np.where(prev >= 0, prev[None, :] + shift[:, None], -1),
                "level": np.broadcast_to(u.level, (r, u.n)),
                "in": np.where(u.in_pair >= 0, pair_of + u.in_pair, -1),
                "out": np.where(u.out_pair >= 0, pair_of + u.out_pair, -1),
            }
            for name, val in columns.items():
                parts[name].append(np.asarray(val).reshape(-1))
            sizes.append(np.tile(np.diff(u.starts), r))
            base += r * u.n
        cat = {k: np.concatenate(v) if v else np.zeros(0, np.int64) for k, v in parts.items()}
        self.V = V = base
        level = cat["level"]
        order = np.argsort(level.astype(np.int32 if V and level.max() > 32000 else np.int16), kind="stable")
        rank = np.empty(V + 1, dtype=np.int64)
        rank[order] = np.arange(V)
        rank[V] = V  # sentinel: free = 0 before a group's first chunk, end = -inf for no dependency
        self.groups = groups
        self.group_index = {g: k for k, g in enumerate(groups)}
        self.pairs = pairs
        self.gidx = cat["gidx"][order]
        self.kind = cat["kind"][order]
        self.mb = cat["mb"][order]
        self.prev = rank[np.where(cat["prev"] >= 0, cat["prev"], V)][order]
        self.dep = rank[np.where(cat["dep"] >= 0, cat["dep"], V)][order]
        self.in_pair = cat["in"][order]
        self.out_pair = cat["out"][order]
        counts = np.bincount(level, minlength=int(level.max()) + 1 if V else 0)
        ends = np.cumsum(counts).tolist()
        self.levels = [(s, e, self.prev[s:e], self.dep[s:e]) for s, e in zip([0] + ends[:-1], ends)]
        for g in program.chunks:  # groups without chunks (a replica with no micro-batches)
            if g not in self.group_index:
                self.group_index[g] = len(groups)
                groups.append(g)
                sizes.append(np.zeros(1, dtype=np.int64))
        size = np.concatenate(sizes) if sizes else np.zeros(0, np.int64)
        self._starts = np.concatenate([[0], np.cumsum(size)]).astype(np.int64)
        self._rank = rank
        self._nonempty = size > 0
        self.last = np.where(self._nonempty, rank[np.maximum(self._starts[1:] - 1, 0)], V)
        live = program.live_peaks([g for u in units for g in u.groups])
        self.live_peak = {
            g: live.get(g, live.get((self._rep.get(g[0], -1), g[1]), 0)) for g in groups
        }  # members share their representative's order; groups without chunks hold none
        holders = [np.array([self.group_index[h] for h in seg.groups]) for seg in program.segments]
        self.segments = list(zip([seg.layers for seg in program.segments], holders))

    def _units(self, program: Program) -> list[_Unit]:
        """Replica classes of identical structure (each one tiled unit), or the whole plan as one."""
        plan = program.plan
        self._rep: dict[int, int] = {}
        if plan.assignment:
            return [_Unit(program, [g for g in program.chunks if program.chunks[g]], None)]
        classes: dict[tuple[int, int], list[int]] = {}
        for d, stages in enumerate(plan.replicas):
            if plan.microbatches[d]:
                classes.setdefault((len(stages), plan.microbatches[d]), []).append(d)
        units = []
        for members in classes.values():
            for d in members:
                self._rep[d] = members[0]
            units.append(_Unit(program, [(members[0], i) for i in range(len(plan.replicas[members[0]]))],
                               members))  # fmt: skip
        return units

    # ------------------------------------------------------------------ evaluation
    def run(self, dur: np.ndarray, edge: np.ndarray, send: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(end, free), each (V + 1, batch), of every vertex for (V, batch) durations, incoming
        transfer times and blocking-send times in vertex order (row V: the sentinel)."""
        batch = dur.shape[1:]
        end = np.empty((self.V + 1, *batch))
        free = np.empty((self.V + 1, *batch))
        end[self.V] = -np.inf
        free[self.V] = 0.0
        maximum = np.maximum
        for s, e, prev, dep in self.levels:
            t = maximum(free[prev], end[dep] + edge[s:e]) + dur[s:e]
            end[s:e] = t
            free[s:e] = t + send[s:e]
        return end, free

    def sync(self, free: np.ndarray, segment_s, step_s) -> np.ndarray:
        """(groups, batch) time each group has stepped: its segments reduced in layer order after
        `free` (V + 1, batch), each starting once every holder is free. `segment_s`: layers -> s."""
        t = free[self.last]  # (groups, batch): free after the last chunk (0 for none)
        for layers, holders in self.segments:
            t[holders] = t[holders].max(axis=0) + segment_s.get(layers, 0.0)
        return t + step_s

    def group_sums(self, values: np.ndarray) -> np.ndarray:
        """(groups, batch) sums over each group's vertices of (V, batch) `values`, in program order."""
        out = np.zeros((len(self.groups), *values.shape[1:]))
        if self.V:
            major = values[self._rank[: self.V]]  # group-major, program order
            out[self._nonempty] = np.add.reduceat(major, self._starts[:-1][self._nonempty], axis=0)
        return out

    def vertices(self, g: GroupKey) -> np.ndarray:
        """Group g's vertex ids in program order."""
        k = self.group_index[g]
        return self._rank[self._starts[k] : self._starts[k + 1]]
