"""Test oracle: the DAG evaluation chunk by chunk in plain Python floats (the pre-vectorised pass).

Kept only to check `resihp.evaluator.dag` against: the same recurrence, walked group by group in program
order, advancing a group while its next chunk's data dependency is done, then the gradient
segments reduced in layer order and the step. It shares nothing with the evaluator but the
Program (its chunk orders and segments), the Costs (with `linear_time`) and the Schedule's
gradient point.
"""

from __future__ import annotations

from resihp.core.costs import Costs, linear_time
from resihp.core.program import B, F, Program, W
from resihp.core.schedule import get_schedule


def oracle_evaluate(program: Program, costs: Costs) -> dict:
    """{"iteration_s", "group_end_s", "busy_s" (per group), "live_peak", "end" (per chunk)}."""
    plan = program.plan
    grad_kind = get_schedule(plan.schedule).grad_kind
    last = {src: len(stages) - 1 for src, stages in enumerate(plan.replicas)}
    groups = list(program.chunks)
    offsets = [plan.mb_offset(d) for d in range(plan.dp)]

    def dur(g, kind, src, j):
        c0, alpha, beta = costs.chunk[g][kind]
        k = offsets[src] + j
        return float(linear_time(c0, alpha, beta, costs.tokens[k], costs.sum_sq[k]))

    end: dict[tuple, float] = {}  # (kind, src, j, stage) -> end time
    free = dict.fromkeys(groups, 0.0)
    pos = dict.fromkeys(groups, 0)
    busy = dict.fromkeys(groups, 0.0)
    remaining = sum(len(c) for c in program.chunks.values())
    while remaining:
        progressed = False
        for g in groups:
            chunks = program.chunks[g]
            i = g[1]
            t = free[g]
            while pos[g] < len(chunks):
                kind, src, j = chunks[pos[g]]
                dep = None
                if kind == F and i > 0:
                    dep = (F, src, j, i - 1)
                elif kind == B and i < last[src]:
                    dep = (grad_kind, src, j, i + 1)
                if dep is not None:
                    if dep not in end:
                        break
                    peer = (plan.executor(src, j, dep[3]), dep[3])
                    ready = end[dep] + costs.p2p(peer, g)
                    if ready > t:
                        t = ready
                d = dur(g, kind, src, j)
                busy[g] += d
                t += d
                end[(kind, src, j, i)] = t
                if costs.send_blocks:
                    if kind == F and i < last[src]:
                        t += costs.p2p(g, (plan.executor(src, j, i + 1), i + 1))
                    elif kind == grad_kind and i > 0:
                        t += costs.p2p(g, (plan.executor(src, j, i - 1), i - 1))
                pos[g] += 1
                remaining -= 1
                progressed = True
            free[g] = t
        assert progressed, "program deadlocks"
    for seg in program.segments:
        done = max(free[h] for h in seg.groups) + costs.segment_s.get(seg.layers, 0.0)
        for h in seg.groups:
            free[h] = done
    group_end = {g: free[g] + costs.step_s for g in groups}
    live = {}
    for g, chunks in program.chunks.items():
        n = peak = 0
        for kind, _, _ in chunks:
            n += 1 if kind == F else (-1 if kind == W else 0)
            peak = max(peak, n)
        live[g] = peak
    return {
        "iteration_s": max(group_end.values()),
        "group_end_s": group_end,
        "busy_s": busy,
        "live_peak": live,
        "end": end,
    }
