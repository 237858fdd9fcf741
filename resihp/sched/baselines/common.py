"""Pieces the baseline policies share: restart plans, dead TP groups, replica rates, costs.

Reconfiguration costs come from `resihp.sched.reconfig` (communicator rebuild 2 s, state transfer
by bytes and bandwidth + 1.5 s per layer); the constants below are the baselines' own
(baselines.md §2, suggested defaults).
"""

from __future__ import annotations

import random

from resihp.core.plan import Plan, build_stage, even_split, split_by_weight
from resihp.sched.base import Decision, Reconfig
from resihp.sched.model import iteration_time, pipeline_key
from resihp.sched.reconfig import reconfig_cost

RESTART_S = 600.0  # u0: restart overhead (cost-model.md §8.2)
CHECKPOINT_INTERVAL_S = 3600.0  # Δ: lost work per restart is uniform on [0, Δ]
MANUAL_SLOW_S = 3600.0  # checkpoint-restart notices a fail-slow by hand after 60 min
PLANNING_S = 2.0  # ReCycle's MILP time is not published (baselines.md §2.3)
OOBLECK_REINIT_S = 30.0  # Oobleck engine re-instantiation (baselines.md §2.4)


def next_generation(plan: Plan, new: Plan) -> Plan:
    return new.with_changes(generation=plan.generation + 1)


def unchanged(plan: Plan, reason: str = "no action") -> Decision:
    return Decision(plan, Reconfig(), reason=reason)


def dead_groups(ctx, view) -> set[tuple[int, int]]:
    """(replica, stage) positions of the initial plan with a dead device: the whole TP group drops."""
    plan0 = ctx.home
    return {
        (d, i)
        for d, stages in enumerate(plan0.replicas)
        for i, st in enumerate(stages)
        if any(not view.alive[x] for x in st.devices)
    }


def lost_work_s(ctx, view, plan: Plan) -> float:
    """Work since the last checkpoint: uniform on [0, Δ], deterministic in (seed, state)."""
    dead = ",".join(str(d) for d in range(view.num_devices) if not view.alive[d])
    rng = random.Random(f"lost-work:{ctx.workload.seed}:{plan.generation}:{dead}")
    return rng.uniform(0.0, CHECKPOINT_INTERVAL_S)


def restart_plan(ctx, view, exclude=frozenset()) -> Plan | None:
    """Same TP and PP, the most complete pipelines that healthy devices allow; global batch kept.

    TP groups are built inside nodes from healthy, non-excluded devices in id order.
    """
    gpn = view.gpus_per_node
    groups = []
    for node in range(view.nodes):
        ok = [
            x
            for x in range(node * gpn, (node + 1) * gpn)
            if view.alive[x] and view.speed[x] >= 1.0 and x not in exclude
        ]
        groups += [ok[k : k + ctx.tp] for k in range(0, len(ok) - ctx.tp + 1, ctx.tp)]
    dp = min(len(groups) // ctx.pp, ctx.global_microbatches)
    if dp < 1:
        return None
    devices = [x for g in groups[: dp * ctx.pp] for x in g]
    plan = Plan.uniform(ctx.model, ctx.tp, ctx.pp, dp, 1, ctx.schedule, devices=devices)
    return plan.with_changes(microbatches=even_split(ctx.global_microbatches, dp))


def restart(ctx, plan: Plan, view, exclude=frozenset(), lose_work: bool = True, reason="restart") -> Decision:
    """Checkpoint-restart on the healthy devices; waits (hangs) for repair when no pipeline fits."""
    new = restart_plan(ctx, view, exclude)
    if new is None:
        return Decision(plan, Reconfig(pause_s=0.0), reason="no complete pipeline: waiting for repair")
    lost = lost_work_s(ctx, view, plan) if lose_work else 0.0
    reconfig = Reconfig(pause_s=RESTART_S, lost_work_s=lost)
    return Decision(next_generation(plan, new), reconfig, reason=reason)


def link_excluded(view) -> set[int]:
    """Sender ends of slow links (a restart leaves them out)."""
    return {a for a, _, _ in view.links}


def alone_time(ctx, stages, m: int, schedule: str, view, cache: dict) -> float:
    """Iteration time of one pipeline run alone, shared among pipelines with the same key."""
    key = pipeline_key(stages, m, view)
    if key not in cache:
        cache[key] = iteration_time(ctx, Plan(ctx.model, (stages,), (m,), schedule), view)
    return cache[key]


def replica_rates(ctx, plan: Plan, view) -> list[float]:
    """Each replica's own throughput measured alone (what Greyhound's S2 weights by)."""
    rates, cache = [], {}
    m = ctx.workload.num_microbatches
    for stages in plan.replicas:
        if any(st.hollow for st in stages):
            rates.append(min((view.speed[x] for st in stages for x in st.devices), default=1.0))
            continue
        rates.append(m / alone_time(ctx, stages, m, plan.schedule, view, cache))
    return rates


def reweight(ctx, plan: Plan, weights) -> Plan:
    """S2: the global batch over replicas in proportion to `weights` (whole micro-batches, >= 1)."""
    return plan.with_changes(microbatches=split_by_weight(plan.global_microbatches, list(weights), 1))


def resplit(ctx, stages, view):
    """S3: a replica's layers re-split in proportion to its stages' group speeds (>= 1 each)."""
    speeds = [min(view.speed[x] for x in st.devices) for st in stages]
    counts = split_by_weight(ctx.model.num_layers, speeds, 1)
    out, lo = [], 0
    for st, n in zip(stages, counts):
        out.append(build_stage(ctx.model, st.devices, (lo, lo + n)))
        lo += n
    return tuple(out)


def switch(ctx, plan: Plan, new: Plan, view, reason: str, extra_s: float = 0.0) -> Decision:
    """A live reconfiguration from `plan` to `new`: rebuild + state transfer (+ `extra_s`)."""
    cost = reconfig_cost(ctx, plan, new, view, planning_s=extra_s)
    return Decision(next_generation(plan, new), cost, reason=reason)
