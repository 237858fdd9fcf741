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

from resihp.core.plan import Plan, Stage, build_stage, even_split
from resihp.cost import memory
from resihp.cost.hardware import hardware_preset

from .base import Decision, Policy, same_work
from .layout import Draft, assemble, cover_lost_stages, select_groups, standby_of
from .migrate import microbatch_costs
from .model import (
    chunk_memory_check,
    fits_memory,
    group_speed,
    head_layers,
    iteration_time,
    max_layers,
    n_live,
)
from .partition import repartition_paper
from .progress import progress_migrate
from .reconfig import PAPER_PLANNING_S, reconfig_cost
from .tp import select_tp_subgroup


def migration_inputs(ctx, plan, cluster, speeds):
    """(scale, costs, mem_ok) for the migration planners: seconds-per-cost units per group, the
    micro-batch costs and the exact per-group memory check (`model.chunk_memory_check`)."""
    head = head_layers(ctx.model)
    scale = {}
    for d, stages in enumerate(plan.replicas):
        for i, st in enumerate(stages):
            v = speeds.get((d, i), 0.0)
            work = st.num_layers + (head if i == len(stages) - 1 else 0.0)
            scale[(d, i)] = work / v if v > 0 and not st.hollow else math.inf
    return scale, microbatch_costs(ctx, plan), chunk_memory_check(ctx, plan)


def without_broken_replicas(draft: Draft) -> tuple[Draft, list[int]]:
    """(`draft` without the replicas that have a hollow stage, the replicas kept): the dropped
    replicas' live devices become standbys and the global batch is split evenly over the rest.
    The DP fallback when a lost stage's work fits no peer's memory; ValueError when no replica is
    whole."""
    keep = [d for d, stages in enumerate(draft.replicas) if not any(st.hollow for st in stages)]
    if not keep:
        raise ValueError("no replica has every stage and the lost stages' work fits no peer's memory")
    freed = [x for d, r in enumerate(draft.replicas) if d not in keep for st in r for x in st.devices]
    rest = Draft(
        draft.ctx, tuple(draft.replicas[d] for d in keep),
        even_split(draft.global_microbatches, len(keep)), tuple(sorted((*draft.standby, *freed))),
    )  # fmt: skip
    return rest, keep


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

    def chooser(self, ctx, cluster, relaxed: bool = False):
        """choose(position, live devices) -> (group, speed): eq. 3/4 over the live members, no
        wider than the home group. k_min is taken at the position's home layer count, or with
        `relaxed` at one layer (the layer repartition then gives the group what it can hold)."""
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
                ctx.model, 1 if relaxed else layers[1] - layers[0], i == 0, i == pp - 1,
                ctx.workload.seq_len, n_live(ctx.schedule, m, i, pp), hw, plan0.dp,
                max_tp=plan0.replicas[d][i].tp,
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
        return self.planned(ctx, cluster)[0]

    def planned(self, ctx, cluster) -> tuple[Plan, str]:
        """(plan, note): `plan_for`'s plan and, when memory shaped it, how ("" otherwise).

        Algorithm 1 moves a chunk only while the receiving group's memory fits its live
        activations as the compiled order keeps them (`model.chunk_memory_check`: one template's
        count per source pipeline), so every plan returned fits. When the steps leave work that
        fits nowhere (a lost stage's chunks fit no peer, or the layers fit no split), two
        fallbacks are tried in order: eq. 3's k_min at one layer instead of the home layer count
        (groups that could not hold their home layers stay, with fewer layers), then the replicas
        that lost a stage dropped (`without_broken_replicas`, their devices standbys, Algorithm 1
        on the rest). ValueError when none fits: the live devices cannot hold the model."""
        try:
            return self._planned(ctx, cluster, relaxed=False)
        except ValueError as exc:
            first = exc
        try:
            plan, note = self._planned(ctx, cluster, relaxed=True)
            return plan, "; ".join(
                x for x in ("eq. 3's k_min at one layer: the home layers fit no plan", note) if x
            )
        except ValueError:
            pass
        draft, group_speeds = self._draft(ctx, cluster, relaxed=False)
        if not draft.hollow:
            raise first
        rest, keep = without_broken_replicas(draft)
        pp = len(rest.replicas[0])
        speeds_rest = {(k, i): group_speeds[(d, i)] for k, d in enumerate(keep) for i in range(pp)}
        if not fits_memory(ctx, rest.to_plan()):  # more micro-batches live, fewer optimizer shards
            raise ValueError("the lost stages' work fits no peer's memory, nor the whole replicas'")
        plan, note = self._migrated(ctx, rest, speeds_rest, cluster)
        dropped = [d for d in range(draft.dp) if d not in keep]
        why = f"replicas {dropped} dropped: their lost stage's work fits no peer's memory"
        return plan, "; ".join(x for x in (why, note) if x)

    def _planned(self, ctx, cluster, relaxed: bool) -> tuple[Plan, str]:
        draft, group_speeds = self._draft(ctx, cluster, relaxed)
        return self._migrated(ctx, draft, group_speeds, cluster)

    def _draft(self, ctx, cluster, relaxed: bool):
        """(draft, group speeds): steps 1-3 (TP groups, snapshot fallback, one layer split)."""
        choose = self.chooser(ctx, cluster, relaxed)
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
        return draft, {g: c[1] for g, c in chosen.items()}

    def _migrated(self, ctx, draft: Draft, group_speeds, cluster) -> tuple[Plan, str]:
        """(draft with Algorithm 1's moves, note on the moves memory refused)."""
        dp, pp = draft.dp, len(draft.replicas[0])
        uneven = any(len({round(group_speeds[(d, i)], 9) for d in range(dp)}) > 1 for i in range(pp))
        balance = "WM" in self.components
        if not (uneven if balance else draft.hollow):
            return draft.to_plan(), ""
        scale, costs, fits = migration_inputs(ctx, draft, cluster, group_speeds)
        refused = [0]

        def mem_ok(g, counts) -> bool:
            ok = fits(g, counts)
            refused[0] += not ok
            return ok

        delta = self.delta if balance else math.inf  # no WM: fail-stop eviction only
        plan = draft.to_plan(progress_migrate(draft, scale, costs, mem_ok, delta))
        assert fits_memory(ctx, plan), "moves within chunk_memory_check must give a plan that fits"
        return plan, f"Algorithm 1: memory refused {refused[0]} candidate moves" if refused[0] else ""

    def decide(self, ctx, plan, cluster, reports) -> Decision:
        try:
            new, note = self.planned(ctx, cluster)
        except ValueError as exc:
            return Decision(None, reason=f"abort: {exc}")
        reason = "progressive TP->PP->DP (paper)" + (f"; {note}" if note else "")
        return finish(self, ctx, plan, new, cluster, reason)


def finish(policy, ctx, plan: Plan, new: Plan, cluster, reason: str) -> Decision:
    """The Decision for switching `plan` -> `new` (same generation when nothing changes)."""
    same = same_work(new, plan)
    new = new.with_changes(generation=plan.generation + (0 if same else 1), schedule=plan.schedule)
    if same:
        new = plan
    rc = reconfig_cost(ctx, plan, new, cluster, policy.planning_s)
    return Decision(new, rc, iteration_time(ctx, new, cluster, policy.evaluator), reason)
