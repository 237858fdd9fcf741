"""Evaluate a compiled Program on a Costs table: iteration time, busy/idle time and peak memory.

The DAG pass itself is `evaluator.dag.Dag` (one evaluator for every caller); this module turns a
`Costs` into its per-unit durations and transfer times (`lanes`), and its result into an
`IterationResult`. `write_trace` writes a Chrome trace of one evaluation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from resihp.core.costs import Costs, uniform_costs
from resihp.core.program import KIND_NAMES, Program, compile_plan

from .dag import Dag

__all__ = ["IterationResult", "Costs", "compile_plan", "evaluate", "lanes", "uniform_costs", "write_trace"]


@dataclass
class IterationResult:
    iteration_s: float
    busy_s: dict[int, float]  # per device: compute time
    idle_s: dict[int, float]  # per device: iteration_s - busy_s
    peak_memory_bytes: dict[int, float]
    live_peak: dict[tuple[int, int], int]  # per group: most micro-batches holding activations
    group_end_s: dict[tuple[int, int], float]  # per group: after its gradient sync and step
    spans: dict[tuple[int, int], list[tuple[int, int, int, float, float]]]  # (kind, src, j, start, end)

    @property
    def bubble_fraction(self) -> float:
        """Mean over devices of idle / iteration time."""
        if not self.busy_s:
            return 0.0
        return float(np.mean([idle / self.iteration_s for idle in self.idle_s.values()]))


def lanes(dag: Dag, costs: Costs) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per unit: (duration, incoming transfer, blocking send) seconds, each (V, members)."""
    out = []
    for u in dag.units:
        members, width = len(u.replicas), len(u.groups)
        gidx = np.arange(members)[None, :] * width + u.gi[:, None]  # (V, members) into member_groups
        dur = costs.vertex_times(u.member_groups(), gidx, u.kind[:, None], u.mb)
        p2p = np.array([[costs.p2p(a, b) for a, b in u.member_pairs(r)] + [0.0] for r in range(members)]).T
        edge = p2p[u.in_pair]  # (V, members); pair -1: the zero row
        send = p2p[u.out_pair] if costs.send_blocks else np.zeros_like(dur)
        out.append((dur, edge, send))
    return out


def evaluate(program: Program, costs: Costs, keep_spans: bool = False) -> IterationResult:
    """One iteration of `program` under `costs` (`keep_spans`: every chunk's start and end too)."""
    dag = Dag.of(program)
    ln = lanes(dag, costs)
    times = dag.run(ln)
    group_end = dag.sync([free for _, free in times], costs.segment_s, costs.step_s).tolist()
    iteration = max(group_end) if group_end else 0.0
    busy_g = dag.group_sums([dur for dur, _, _ in ln]).tolist()
    plan = program.plan
    busy, idle, peak_mem = {}, {}, {}
    mem_static, mem_act = costs.mem_static, costs.mem_act
    for g, total in zip(dag.groups, busy_g):
        live = dag.live_peak[g]
        for dev in plan.replicas[g[0]][g[1]].devices:
            busy[dev] = total
            idle[dev] = iteration - total
            peak_mem[dev] = mem_static.get(dev, 0.0) + live * mem_act.get(dev, 0.0)
    spans: dict = {}
    if keep_spans:
        starts = [
            np.maximum(free[u.prev], end[u.dep] + edge)
            for u, (end, free), (_, edge, _) in zip(dag.units, times, ln)
        ]
        for g in dag.groups:
            k, r, v = dag.vertices(g)
            if k < 0:
                spans[g] = []
                continue
            t0, t1 = starts[k][v, r].tolist(), times[k][0][v, r].tolist()
            spans[g] = [(*c, a, b) for c, a, b in zip(program.chunks[g], t0, t1)]
    ends = dict(zip(dag.groups, group_end))
    return IterationResult(iteration, busy, idle, peak_mem, dict(dag.live_peak), ends, spans)


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
