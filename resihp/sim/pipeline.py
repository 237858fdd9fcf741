"""Evaluate a compiled Program: the paper's iteration-time predictor (eq. 2) as a DAG pass.

Vertices are the F/B/W chunks of every group in program order. Edges: the previous chunk of the
same group (a device runs one chunk at a time, weight 0) and the data dependency (F of the previous
stage, B of the next stage, weighted by the P2P time). start(v) = max over predecessors u of
end(u) + edge(u, v); the iteration ends when the last group finishes its gradient sync and step.
Chunks are processed group by group in program order, advancing a group while its next chunk's
data dependency is resolved, so each vertex is visited once and a deadlocked order is reported.
"""

from __future__ import annotations

import json

from resihp.core.costs import Costs, uniform_costs
from resihp.core.program import KIND_NAMES, Program, compile_plan

from .structure import IterationResult, Structure
from .symmetric import evaluate_symmetric, is_symmetric

__all__ = ["IterationResult", "Costs", "compile_plan", "evaluate", "uniform_costs", "write_trace"]


def evaluate(program: Program, costs: Costs, keep_spans: bool = False) -> IterationResult:
    if not keep_spans and is_symmetric(program.plan):
        return evaluate_symmetric(program, costs)
    if "sim" not in program._cache:
        program._cache["sim"] = Structure(program)
    st: Structure = program._cache["sim"]
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


def _finish(program: Program, st: Structure, costs: Costs, free, dur, spans) -> IterationResult:
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
