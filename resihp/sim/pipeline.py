"""Evaluate a compiled Program: the paper's iteration-time predictor (eq. 2) as a DAG pass.

Vertices are the F/B/W chunks of every group in program order. Edges: the previous chunk of the
same group (a device runs one chunk at a time, weight 0) and the data dependency (F of the previous
stage, B of the next stage, weighted by the P2P time). start(v) = max over predecessors u of
end(u) + edge(u, v); the iteration ends when the last group finishes its gradient sync and step.
Chunks are processed group by group in program order, advancing a group while its next chunk's
data dependency is resolved, so each vertex is visited once and a deadlocked order is reported.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass

import numpy as np

from resihp.core.costs import Costs, uniform_costs
from resihp.core.program import KIND_NAMES, B, F, Program, W, compile_plan

__all__ = ["IterationResult", "Costs", "compile_plan", "evaluate", "uniform_costs", "write_trace"]


@dataclass
class IterationResult:
    iteration_s: float
    busy_s: dict[int, float]  # per device: compute time
    idle_s: dict[int, float]  # per device: iteration_s - busy_s
    peak_memory_bytes: dict[int, float]
    live_peak: dict[tuple[int, int], int]  # per group: most micro-batches holding activations
    group_end_s: dict[tuple[int, int], float]
    spans: dict[tuple[int, int], list[tuple[int, int, int, float, float]]]  # (kind, src, j, start, end)

    @property
    def bubble_fraction(self) -> float:
        """Mean over devices of idle / iteration time."""
        if not self.busy_s:
            return 0.0
        return float(np.mean([idle / self.iteration_s for idle in self.idle_s.values()]))


def evaluate(program: Program, costs: Costs, keep_spans: bool = False) -> IterationResult:
    if "sim" not in program._cache:
        program._cache["sim"] = _Structure(program)
    st: _Structure = program._cache["sim"]
    groups = st.groups
    lanes = {g: st.lane(g, costs) for g in groups}
    end = [-1.0] * st.num_keys  # end time of every chunk, by its integer key
    free = dict.fromkeys(groups, 0.0)
    pos = dict.fromkeys(groups, 0)
    spans: dict = {g: [] for g in groups} if keep_spans else {}
    remaining = sum(len(st.me[g]) for g in groups)
    while remaining:
        progressed = False
        for g in groups:
            me, dep = st.me[g], st.dep[g]
            edge, dur, send = lanes[g]
            k = k0 = pos[g]
            n = len(me)
            t = free[g]
            while k < n:
                dk = dep[k]
                if dk >= 0:
                    ready = end[dk]
                    if ready < 0.0:
                        break  # data dependency not computed yet: go on with the next group
                    ready += edge[k]
                    if ready > t:
                        t = ready
                if keep_spans:
                    spans[g].append((*program.chunks[g][k], t, t + dur[k]))
                t += dur[k]
                end[me[k]] = t
                t += send[k]
                k += 1
            if k > k0:
                remaining -= k - k0
                progressed = True
                pos[g] = k
                free[g] = t
        if not progressed:
            stuck = {g: program.chunks[g][pos[g]] for g in groups if pos[g] < len(st.me[g])}
            raise AssertionError(f"program deadlocks; next chunks per group: {stuck}")
    return _finish(program, st, costs, free, {g: lanes[g][1] for g in groups}, spans)


class _Structure:
    """Cost-independent arrays of a Program: integer chunk keys and data-dependency keys.

    A chunk (kind, src, j, stage) has key ((kind*dp + src)*M + j)*P + stage. F depends on F of the
    previous stage; B on the next stage's chunk after which the gradient is sent (B for zbh1,
    W otherwise, since 1F1B and GPipe send the gradient after the whole backward).
    """

    def __init__(self, program: Program) -> None:
        plan = program.plan
        self.groups = [g for g in program.chunks if program.chunks[g]]
        self.dp, self.m = plan.dp, max(plan.microbatches)
        self.p = max(len(s) for s in plan.replicas)
        self.num_keys = 3 * self.dp * self.m * self.p
        offsets = np.array([plan.mb_offset(d) for d in range(plan.dp)])
        last = np.array([len(s) - 1 for s in plan.replicas])
        execs = np.broadcast_to(np.arange(self.dp)[:, None, None], (self.dp, self.m, self.p)).copy()
        for src, j, i, dst in plan.assignment:
            execs[src, j, i] = dst
        grad_kind = B if plan.schedule == "zbh1" else W
        self.me, self.dep, self.arrays, self.peers, self.live_peak = {}, {}, {}, {}, {}
        for g in self.groups:
            ch = program.chunks[g]
            arr = np.fromiter(itertools.chain.from_iterable(ch), np.int64, 3 * len(ch)).reshape(-1, 3)
            kind, src, j = arr[:, 0], arr[:, 1], arr[:, 2]
            i = g[1]
            fwd = (kind == F) & (i > 0)
            bwd = (kind == B) & (i < last[src])
            dep = np.full(len(kind), -1, dtype=np.int64)
            dep[fwd] = self._key(F, src[fwd], j[fwd], i - 1)
            dep[bwd] = self._key(grad_kind, src[bwd], j[bwd], i + 1)
            self.me[g] = self._key(kind, src, j, i).tolist()
            self.dep[g] = dep.tolist()
            self.arrays[g] = (kind, offsets[src] + j)
            # (mask, peer replica per chunk, peer stage, data flows into g?) for edge and send times
            up = (kind == F) & (i < last[src])
            down = (kind == grad_kind) & (i > 0)
            self.peers[g] = [
                (mask, execs[src[mask], j[mask], stage], stage, into)
                for mask, stage, into in ((fwd, i - 1, True), (bwd, i + 1, True), (up, i + 1, False),
                                          (down, i - 1, False))
                if mask.any()
            ]  # fmt: skip
            self.live_peak[g] = int(np.cumsum((kind == F).astype(int) - (kind == W)).max())

    def _key(self, kind, src, j, stage):
        return ((kind * self.dp + src) * self.m + j) * self.p + stage

    def lane(self, g, costs: Costs) -> tuple[list, list, list]:
        """Per chunk of g: incoming edge time, duration, and time a blocking send holds g."""
        kind, mbi = self.arrays[g]
        table = costs.chunk[g]
        dur = table[kind, 0] + table[kind, 1] * costs.tokens[mbi] + table[kind, 2] * costs.sum_sq[mbi]
        edge = np.zeros(len(kind))
        send = np.zeros(len(kind))
        for mask, peers, stage, into in self.peers[g]:
            if not into and not costs.send_blocks:
                continue
            vals = np.zeros(len(peers))
            for r in np.unique(peers):
                other = (int(r), stage)
                vals[peers == r] = costs.p2p(other, g) if into else costs.p2p(g, other)
            (edge if into else send)[mask] += vals
        return edge.tolist(), dur.tolist(), send.tolist()


def _finish(program: Program, st: _Structure, costs: Costs, free, dur, spans) -> IterationResult:
    plan = program.plan
    group_end: dict = {}
    # Gradient sync: groups holding the same layers reduce together once all of them are done.
    for g in st.groups:
        ready = max(free.get(h, 0.0) for h in program.grad_group(g))
        group_end[g] = ready + costs.allreduce_s.get(g, 0.0) + costs.step_s
    iteration = max(group_end.values()) if group_end else 0.0
    busy: dict[int, float] = {}
    idle: dict[int, float] = {}
    peak_mem: dict[int, float] = {}
    for g in st.groups:
        total = float(sum(dur[g]))
        peak = st.live_peak[g]
        for dev in plan.replicas[g[0]][g[1]].devices:
            busy[dev] = total
            idle[dev] = iteration - total
            peak_mem[dev] = costs.mem_static.get(dev, 0.0) + peak * costs.mem_act.get(dev, 0.0)
    return IterationResult(iteration, busy, idle, peak_mem, dict(st.live_peak), group_end, spans)


def write_trace(program: Program, result: IterationResult, path: str) -> None:
    """Chrome-trace JSON (chrome://tracing, Perfetto): one process per replica, one row per stage."""
    if not result.spans:
        raise ValueError("evaluate(..., keep_spans=True) is needed for a trace")
    events = []
    for (d, i), spans in sorted(result.spans.items()):
        devices = program.devices((d, i))
        events.append({"ph": "M", "name": "process_name", "pid": d, "args": {"name": f"replica {d}"}})
        events.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": d,
                "tid": i,
                "args": {"name": f"stage {i} devices {list(devices)}"},
            }
        )
        for kind, src, j, start, end in spans:
            name = f"{KIND_NAMES[kind]}{j}" + (f"@r{src}" if src != d else "")
            events.append(
                {
                    "ph": "X",
                    "name": name,
                    "cat": KIND_NAMES[kind],
                    "pid": d,
                    "tid": i,
                    "ts": round(start * 1e6, 3),
                    "dur": round((end - start) * 1e6, 3),
                    "args": {"src_replica": src, "microbatch": j},
                }
            )
    for g, end in sorted(result.group_end_s.items()):
        events.append(
            {"ph": "i", "name": "step", "pid": g[0], "tid": g[1], "ts": round(end * 1e6, 3), "s": "t"}
        )
    with open(path, "w") as fh:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, fh)
