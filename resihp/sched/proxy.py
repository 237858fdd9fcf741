"""The scheduler's cheap ranking proxy for candidate plans (no DAG), from the analytic view of
`model.py` and the micro-batch costs of `migrate.py`."""

from __future__ import annotations

from resihp.core.plan import Plan
from resihp.cost.hardware import hardware_preset

from .migrate import mean_chunk_flops, microbatch_costs
from .model import group_speed, stage_work


def _unit(ctx, plan: Plan, cluster, iteration: int) -> float:
    """Seconds of one layer of the iteration's mean micro-batch on one healthy device."""
    return mean_chunk_flops(ctx, plan, iteration) / hardware_preset(cluster.gpu).achieved_flops


def _stage_s(ctx, st, last: bool, cluster, unit: float) -> float:
    return unit * stage_work(ctx.model, st.num_layers, last) / group_speed(ctx.model, st, cluster.speed)


def replica_times(ctx, plan: Plan, cluster, iteration: int = 0) -> list[tuple[float, float]]:
    """Per replica of a plan without hollow stages: (fill, slot) seconds, so that it runs n
    micro-batches in about fill + n·slot (1F1B: Σ t_i + (n - 1)·max t_i), by the same stage
    times as `proxy_time`."""
    unit = _unit(ctx, plan, cluster, iteration)
    out = []
    for stages in plan.replicas:
        ts = [_stage_s(ctx, st, i == len(stages) - 1, cluster, unit) for i, st in enumerate(stages)]
        out.append((sum(ts) - max(ts), max(ts)))
    return out


def proxy_time(ctx, plan: Plan, cluster, iteration: int = 0) -> float:
    """Cheap iteration-time estimate (no DAG): the busiest group's work plus one pipeline fill.

    1F1B takes about sum_i t_i + (m - 1)·max_i t_i per replica; with migration the busiest group's
    total load replaces m·max_i t_i. It leaves out communication and ordering stalls, so it is
    (about) a lower bound on the ITP; used to rank candidate plans before the full ITP pass.
    """
    unit = _unit(ctx, plan, cluster, iteration)
    costs = microbatch_costs(ctx, plan, iteration)
    t: dict = {}
    load: dict = {}
    for d, stages in enumerate(plan.replicas):
        for i, st in enumerate(stages):
            if not st.hollow:
                t[(d, i)] = _stage_s(ctx, st, i == len(stages) - 1, cluster, unit)
                load[(d, i)] = 0.0
    total = [sum(c) for c in costs]
    for d, stages in enumerate(plan.replicas):
        for i, st in enumerate(stages):
            if not st.hollow:
                load[(d, i)] += total[d] * t[(d, i)]
    for src, j, i, dst in plan.assignment:
        c = costs[src][j]
        if (src, i) in load:
            load[(src, i)] -= c * t[(src, i)]
        load[(dst, i)] += c * t[(dst, i)]
    fill = 0.0
    for src, stages in enumerate(plan.replicas):
        ts = [t[(plan.executor(src, 0, i), i)] if plan.microbatches[src] else 0.0 for i in range(len(stages))]
        fill = max(fill, sum(ts) - max(ts))
    return max(load.values()) + fill
