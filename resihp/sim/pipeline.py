"""Evaluate a compiled Program on a Costs table: iteration time, busy/idle time and peak memory.

The DAG pass itself is `sim.dag.Dag` (one evaluator for every caller); this module turns a
`Costs` into its per-vertex durations and transfer times (`lanes`), and its result into an
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


def lanes(dag: Dag, costs: Costs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(duration, incoming transfer, blocking send) seconds of every vertex, each (V, 1)."""
    dur = costs.vertex_times(dag.groups, dag.gidx, dag.kind, dag.mb)
    p2p = np.array([costs.p2p(a, b) for a, b in dag.pairs] + [0.0])  # last: no transfer
    edge = p2p[dag.in_pair]
    send = p2p[dag.out_pair] if costs.send_blocks else np.zeros(dag.V)
    return dur[:, None], edge[:, None], send[:, None]


def evaluate(program: Program, costs: Costs, keep_spans: bool = False) -> IterationResult:
    """One iteration of `program` under `costs` (`keep_spans`: every chunk's start and end too)."""
    dag = Dag.of(program)
    dur, edge, send = lanes(dag, costs)
    end, free = dag.run(dur, edge, send)
    group_end = dag.sync(free, costs.segment_s, costs.step_s)[:, 0].tolist()
    iteration = max(group_end) if group_end else 0.0
    busy_g = dag.group_sums(dur)[:, 0].tolist()
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
        start = np.maximum(free[dag.prev], end[dag.dep] + edge)[:, 0]
        stop = end[:-1, 0]
        for g in dag.groups:
            v = dag.vertices(g)
            spans[g] = [
                (*c, t0, t1) for c, t0, t1 in zip(program.chunks[g], start[v].tolist(), stop[v].tolist())
            ]
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
