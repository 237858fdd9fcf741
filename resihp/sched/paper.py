"""`resihp-paper`: the paper's progressive TP -> PP -> DP adaptation (paper.md §4.4), faithfully.

1. TP: per position, eq. 3/4 over the live members (k_min from memory at the original layer
   count); leftovers become node-local standbys, taken by positions that later lose a device.
2. Every replica of a stage lost: rebuild the stage from the snapshot on standbys (layout.py).
3. PP: one speed-proportional split for all replicas (stage speed = slowest replica's group).
4. DP: Algorithm 1 in the progress simulation (only when replicas of some stage differ).

`components` switches the three steps for the Fig. 11 ablation (paper.md §7.4): without "DE" a
group that lost a member is dropped whole (its work evicted to peers, as ReCycle does) and slow
members stay in; without "LR" every replica keeps the home plan's layer split; without "WM" only
Algorithm 1's fail-stop eviction runs (work of a dropped group must go somewhere), no balancing.
"""

from __future__ import annotations

import math

from resihp.core.plan import Plan, Stage, build_stage
from resihp.cost import memory
from resihp.cost.hardware import hardware_preset

from .base import Decision, Policy
from .layout import assemble, cover_lost_stages, select_groups, standby_of
from .migrate import microbatch_costs
from .model import (
    device_memory,
    fits_memory,
    group_speed,
    head_layers,
    iteration_time,
    max_layers,
    n_live,
    usable_bytes,
)
from .partition import repartition_paper
from .progress import progress_migrate
from .reconfig import PAPER_PLANNING_S, reconfig_cost
from .tp import select_tp_subgroup


def migration_inputs(ctx, plan, cluster, speeds):
    """(scale, costs, mem_ok) for the migration planners: seconds-per-cost units per group."""
    head = head_layers(ctx.model)
    scale = {}
    for d, stages in enumerate(plan.replicas):
        for i, st in enumerate(stages):
            v = speeds.get((d, i), 0.0)
            work = st.num_layers + (head if i == len(stages) - 1 else 0.0)
            scale[(d, i)] = work / v if v > 0 and not st.hollow else math.inf
    cap = usable_bytes(ctx)
    cache: dict = {}

    def mem_ok(g, n) -> bool:
        st = plan.replicas[g[0]][g[1]]
        p = len(plan.replicas[g[0]])
        holders = sum(not r[g[1]].hollow for r in plan.replicas)  # the draft splits every replica alike
        key = (st, g[1], n, holders)
        if key not in cache:
            cache[key] = max(device_memory(ctx, st, g[1], p, n, holders).values()) <= cap
        return cache[key]

    return scale, microbatch_costs(ctx, plan), mem_ok


COMPONENTS = ("DE", "LR", "WM")  # device exclusion (TP), layer repartition (PP), migration (DP)


class ResiHPPaper(Policy):
    """The paper's scheduler, faithfully: progressive TP -> PP -> DP adaptation.

    `delta` is Algorithm 1's threshold, `prefer_larger` eq. 4's tie rule,
    `components` the steps switched on (a subset of COMPONENTS; the Fig. 11 ablation)."""

    name = "resihp-paper"

    def __init__(
        self, delta: int = 1, prefer_larger: bool = True, planning_s: float = PAPER_PLANNING_S,
        evaluator: str = "auto", components=COMPONENTS,
    ) -> None:  # fmt: skip
        unknown = set(components) - set(COMPONENTS)
        if unknown or not components:
            raise ValueError(f"components = {components!r}: a non-empty subset of {COMPONENTS}")
        self.components = tuple(c for c in COMPONENTS if c in components)  # name kept: same alarms
        self.delta = delta
        self.prefer_larger = prefer_larger
        self.planning_s = planning_s
        self.evaluator = evaluator

    def chooser(self, ctx, cluster):
        """choose(position, live devices) -> (group, speed): eq. 3/4 over the live members, no
        wider than the home group."""
        plan0 = ctx.home
        hw = hardware_preset(cluster.gpu)

        def choose(pos, live):
            d, i = pos
            layers = plan0.replicas[d][i].layers
            pp, m = len(plan0.replicas[d]), plan0.microbatches[d]
            if "DE" not in self.components:
                if len(live) < len(plan0.replicas[d][i].devices):
                    return Stage((), layers), 0.0
                st = build_stage(ctx.model, live, layers)
                return st, group_speed(ctx.model, st, cluster.speed)
            k_min = memory.k_min(
                ctx.model, layers[1] - layers[0], i == 0, i == pp - 1, ctx.workload.seq_len,
                n_live(ctx.schedule, m, i, pp), hw, plan0.dp, max_tp=plan0.replicas[d][i].tp,
            )  # fmt: skip
            kept, _ = select_tp_subgroup(
                live, cluster.speed, k_min or len(live) + 1, prefer_larger=self.prefer_larger
            )
            if not kept:
                return Stage((), layers), 0.0
            st = build_stage(ctx.model, kept, layers)
            return st, group_speed(ctx.model, st, cluster.speed)

        return choose

    def plan_for(self, ctx, cluster) -> Plan:
        """The plan for `cluster`, from the home plan's positions (ValueError if none is feasible)."""
        choose = self.chooser(ctx, cluster)
        chosen, pool = select_groups(ctx, cluster, choose)
        cover_lost_stages(ctx, chosen, pool, choose)
        dp, pp = ctx.dp, ctx.pp
        live = {i: [d for d in range(dp) if chosen[(d, i)][1] > 0] for i in range(pp)}
        speeds = [min(chosen[(d, i)][1] for d in live[i]) for i in range(pp)]
        caps = [
            min(
                max_layers(ctx, chosen[(d, i)][0], i, pp, ctx.workload.num_microbatches, len(live[i]))
                for d in live[i]
            )
            for i in range(pp)
        ]
        if "LR" in self.components:
            counts = repartition_paper(ctx.model.num_layers, speeds, caps)
        else:
            counts = tuple(st.num_layers for st in ctx.home.replicas[0])
        draft = assemble(ctx, chosen, [counts] * dp, standby_of(pool))
        group_speeds = {g: c[1] for g, c in chosen.items()}
        uneven = any(len({round(group_speeds[(d, i)], 9) for d in range(dp)}) > 1 for i in range(pp))
        balance = "WM" in self.components
        if not (uneven if balance else draft.hollow):
            return draft.to_plan()
        scale, costs, mem_ok = migration_inputs(ctx, draft, cluster, group_speeds)
        delta = self.delta if balance else math.inf  # no WM: fail-stop eviction only
        plan = draft.to_plan(progress_migrate(draft, scale, costs, mem_ok, delta))
        if not fits_memory(ctx, plan):  # Algorithm 1 counts chunks; the compiled order may keep more live
            raise ValueError("the migrated plan does not fit in memory")
        return plan

    def decide(self, ctx, plan, cluster, reports) -> Decision:
        try:
            new = self.plan_for(ctx, cluster)
        except ValueError as exc:
            return Decision(None, reason=f"abort: {exc}")
        return finish(self, ctx, plan, new, cluster, "progressive TP->PP->DP (paper)")


def finish(policy, ctx, plan: Plan, new: Plan, cluster, reason: str) -> Decision:
    """The Decision for switching `plan` -> `new` (same generation when nothing changes)."""
    same = new.replicas == plan.replicas and new.assignment == plan.assignment
    new = new.with_changes(generation=plan.generation + (0 if same else 1), schedule=plan.schedule)
    if same:
        new = plan
    rc = reconfig_cost(ctx, plan, new, cluster, policy.planning_s)
    return Decision(new, rc, iteration_time(ctx, new, cluster, policy.evaluator), reason)
