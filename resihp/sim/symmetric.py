"""Fast path of the DAG evaluation for plans whose replicas all look alike.

When no chunk migrates, every replica has the same stages and micro-batch count and no stage is
hollow, every replica runs the same chunk sequence; only durations and transfer times differ. One
pass over replica 0's structure then evaluates all replicas at once with numpy vectors of length
dp, giving the same times as the general pass (a test checks it) in a fraction of the time at
large dp. Replicas couple only through the gradient sync, applied at the end as usual.
"""

from __future__ import annotations

import numpy as np

from resihp.core.costs import Costs
from resihp.core.plan import Plan
from resihp.core.program import Program

from .structure import IterationResult, Structure

MIN_DP = 4  # below this the scalar pass is as fast


def is_symmetric(plan: Plan) -> bool:
    return (
        plan.dp >= MIN_DP
        and not plan.assignment
        and len(set(plan.microbatches)) == 1
        and len({len(r) for r in plan.replicas}) == 1
        and not any(st.hollow for r in plan.replicas for st in r)
    )


def _stage_lanes(st: Structure, plan: Plan, costs: Costs, g0) -> tuple[np.ndarray, ...]:
    """(edge, dur, send) arrays of shape (chunks, dp) for stage g0[1] of every replica."""
    i, dp = g0[1], plan.dp
    kind, mbi = st.arrays[g0]
    offsets = np.array([plan.mb_offset(d) for d in range(dp)])
    tables = np.stack([costs.chunk[(d, i)] for d in range(dp)])  # (dp, 3, 3)
    idx = mbi[:, None] + offsets[None, :]  # (chunks, dp)
    dur = (
        tables[:, kind, 0].T
        + tables[:, kind, 1].T * costs.tokens[idx]
        + tables[:, kind, 2].T * costs.sum_sq[idx]
    )
    edge = np.zeros_like(dur)
    send = np.zeros_like(dur)
    for mask, _, stage, into in st.peers[g0]:
        if not into and not costs.send_blocks:
            continue
        vals = np.array(
            [costs.p2p((d, stage), (d, i)) if into else costs.p2p((d, i), (d, stage)) for d in range(dp)]
        )
        (edge if into else send)[mask] += vals[None, :]
    return edge, dur, send


def evaluate_symmetric(program: Program, costs: Costs) -> IterationResult:
    plan = program.plan
    if "sim0" not in program._cache:
        program._cache["sim0"] = Structure(program, first_replica_only=True)
    st: Structure = program._cache["sim0"]
    dp = plan.dp
    lanes = {g: _stage_lanes(st, plan, costs, g) for g in st.groups}
    end = np.zeros((st.num_keys, dp))
    done = [False] * st.num_keys
    free = {g: np.zeros(dp) for g in st.groups}
    pos = dict.fromkeys(st.groups, 0)
    remaining = sum(len(st.me[g]) for g in st.groups)
    maximum = np.maximum
    while remaining:
        progressed = False
        for g in st.groups:
            me, dep = st.me[g], st.dep[g]
            edge, dur, send = lanes[g]
            k = k0 = pos[g]
            t = free[g]
            while k < len(me):
                dk = dep[k]
                if dk >= 0:
                    if not done[dk]:
                        break
                    t = maximum(t, end[dk] + edge[k])
                t = t + dur[k]
                end[me[k]] = t
                done[me[k]] = True
                t = t + send[k]
                k += 1
            if k > k0:
                remaining -= k - k0
                progressed = True
                pos[g], free[g] = k, t
        assert progressed, "symmetric program deadlocks"
    # Gradient sync per stage across replicas, then the step.
    group_end, busy, idle, peak_mem, live_peak = {}, {}, {}, {}, {}
    ends = {g[1]: float(free[g].max()) for g in st.groups}
    for d in range(dp):
        for i in range(len(plan.replicas[d])):
            group_end[(d, i)] = ends[i] + costs.allreduce_s.get((d, i), 0.0) + costs.step_s
    iteration = max(group_end.values())
    for g in st.groups:
        i = g[1]
        totals = lanes[g][1].sum(axis=0)
        for d in range(dp):
            live_peak[(d, i)] = st.live_peak[g]
            for dev in plan.replicas[d][i].devices:
                busy[dev] = float(totals[d])
                idle[dev] = iteration - float(totals[d])
                peak_mem[dev] = costs.mem_static.get(dev, 0.0) + st.live_peak[g] * costs.mem_act.get(dev, 0.0)
    return IterationResult(iteration, busy, idle, peak_mem, live_peak, group_end, {})
