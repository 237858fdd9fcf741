"""`resihp`: our scheduler. It builds several candidate plans and keeps the one that completes the
most iterations over a horizon once its reconfiguration pause is paid:

    score = (horizon_s - pause_s) / predicted iteration_s        (do nothing: pause 0)

Candidates (TP groups from the home plan's positions, `PlanningContext.home`, so re-joins restore
it; layer splits from the running plan's where they keep one):
- "keep": the current plan, when none of its devices died;
- "paper": the `resihp-paper` plan, so `resihp` is never worse than it by this score (as long as
  the proxy bound below holds; skipped on large jobs, see `_large`);
- uneven TP (tp.uneven_stage: any group size, heads/FFN split by speed; standbys taken by groups
  that lost a device) combined with
  - "exclude": the current layer split, no migration (when no stage is hollow);
  - "pipeline": an exact min-max split per replica (when no stage is hollow);
  - "packed": the groups of each stage index re-dealt so the slow ones gather in the replicas
    already slowest (layout.packed), then "pipeline"'s split (when no stage is hollow);
  - "balance": per-stage makespan migration by micro-batch cost, then one exact min-max split on
    the resulting per-stage makespans (the common split lets any replica run any stage's work),
    the moves under the exact memory check at that split; on large jobs only when a stage is hollow.

Every candidate without migration also comes re-split ("+resplit": the global batch over its
replicas by rate, split.py). While a slow link is known, every candidate instead comes relinked
(ranks re-mapped so no transfer uses the slow pair) and re-weighted (the same re-split, by each
replica's ITP under the link), PP transfers take the CPU path, and every candidate gets the full
ITP pass (the proxy does not see links); see links.py.

Candidates are ranked by a cheap proxy and costed by the full ITP in that order (choose_plan), on
the mean of packed batches 1..`samples` (`_iterations`).
"""

from __future__ import annotations

import math

from resihp.core.plan import Plan

from .base import Decision, Policy, same_work
from .layout import assemble, cover_lost_stages, packed, select_groups, standby_of
from .links import link_candidates, link_options, link_time
from .migrate import balance_stage, microbatch_costs, stage_bottleneck
from .model import SPREAD_MICROBATCHES, chunk_memory_check, fits_memory, group_speed, head_layers, max_layers
from .paper import ResiHPPaper
from .partition import minmax_partition
from .proxy import proxy_time
from .reconfig import reconfig_cost
from .split import resplit
from .tp import uneven_stage


def layer_counts(plan: Plan) -> list[tuple[int, ...]]:
    return [tuple(st.num_layers for st in stages) for stages in plan.replicas]


def by_plan(fn):
    """`fn(plan, *rest)` computed once per distinct plan (Plan equality): candidates can coincide
    ("pipeline" is "exclude" when the exact split is the current one), and a pure function of an
    equal plan gives the same answer, so the repeat reuses it (one replan's memo)."""
    seen: list[tuple[Plan, object]] = []

    def once(plan: Plan, *rest):
        for other, answer in seen:
            if other == plan:
                return answer
        answer = fn(plan, *rest)
        seen.append((plan, answer))
        return answer

    return once


def resplit_candidates(ctx, cands, cluster, alone_s) -> list[tuple[str, Plan]]:
    """`cands` re-split over their replicas by rate (split.resplit, one cache of replica passes
    for all), those that change."""
    out, cache = [], {}
    split = by_plan(lambda cand: resplit(ctx, cand, cluster, alone_s, cache=cache))
    for label, cand in cands:
        new = split(cand)
        if new != cand:
            out.append((f"{label}+resplit", new))
    return out


class ResiHP(Policy):
    """Ours: the best of several candidate plans (uneven TP, exact splits, migration) by the ITP.

    `horizon_s` amortizes reconfiguration pauses (math.inf: pick the fastest plan)."""

    name = "resihp"

    def __init__(
        self, horizon_s: float = 1800.0, planning_s: float = 0.1, evaluator: str = "auto",
        min_gain: float = 0.01, delta: int = 1, dag_top: int = 4, include_paper: bool | None = None,
        large_chunks: int = 20000, samples: int | None = None,
    ) -> None:  # fmt: skip
        if samples is not None and samples < 1:
            raise ValueError(f"samples = {samples!r}: must be >= 1 (or None: the default)")
        self.samples = samples
        self.horizon_s = horizon_s
        self.planning_s = planning_s
        self.evaluator = evaluator
        self.min_gain = min_gain
        self.dag_top = dag_top
        self.include_paper = include_paper
        self.large_chunks = large_chunks
        self.paper = ResiHPPaper(delta=delta, planning_s=planning_s, evaluator=evaluator)

    def chooser(self, ctx, cluster):
        """choose(position, live devices) -> (group, speed): the home group as it is while whole
        and healthy, else an uneven TP group no wider than the home group (tp.uneven_stage)."""
        plan0 = ctx.home

        def choose(pos, live):
            d, i = pos
            orig = plan0.replicas[d][i]
            layers = orig.layers
            if tuple(live) == orig.devices and all(cluster.speed[x] == 1.0 for x in live):
                return orig, float(len(live))  # untouched group: keep it as it is
            st, _ = uneven_stage(ctx.model, live, layers, cluster.speed, max_k=orig.tp)
            pp, m = len(plan0.replicas[d]), plan0.microbatches[d]
            if st.hollow or max_layers(ctx, st, i, pp, m, plan0.dp) < 1:
                return st.__class__((), layers), 0.0
            return st, group_speed(ctx.model, st, cluster.speed)

        return choose

    def candidates(self, ctx, plan: Plan, cluster) -> list[tuple[str, Plan]]:
        out: list[tuple[str, Plan]] = []
        if all(cluster.alive[x] for x in plan.devices()):
            out.append(("keep", plan))
        if self._include_paper(ctx):
            try:
                out.append(("paper", self.paper.plan_for(ctx, cluster)))
            except ValueError:
                pass
        choose = self.chooser(ctx, cluster)
        chosen, pool = select_groups(ctx, cluster, choose)
        cover_lost_stages(ctx, chosen, pool, choose)
        dp, pp, L = ctx.dp, ctx.pp, ctx.model.num_layers
        m = ctx.workload.num_microbatches
        head = head_layers(ctx.model)
        standby = standby_of(pool)
        v = {g: c[1] for g, c in chosen.items()}
        hollow = any(s <= 0 for s in v.values())
        # a stage's layers are held (and their optimizer state sharded) by the replicas still running it
        holders = [sum(v[(d, i)] > 0 for d in range(dp)) for i in range(pp)]
        caps = {g: max_layers(ctx, c[0], g[1], pp, m, max(1, holders[g[1]])) for g, c in chosen.items()}
        caps.update({(c[0].devices, g[1]): caps[g] for g, c in chosen.items()})  # by group, for `packed`
        if not hollow:
            current = layer_counts(plan)
            if len(current) == dp and all(len(c) == pp for c in current):
                out.append(("exclude", assemble(ctx, chosen, current, standby).to_plan()))
            gathered = packed(chosen, dp, pp)
            for label, groups in (("pipeline", chosen), ("packed", gathered)):
                if groups is None:
                    continue
                try:
                    splits = [
                        minmax_partition(L, [groups[(d, i)][1] for i in range(pp)],
                                         [caps[groups[(d, i)][0].devices, i] for i in range(pp)],
                                         last_cost=head)
                        for d in range(dp)
                    ]  # fmt: skip
                    out.append((label, assemble(ctx, groups, splits, standby).to_plan()))
                except ValueError:
                    pass
        if hollow or not self._large(ctx):  # costing a migrated plan is slow at scale
            try:
                out.append(("balance", self._balanced(ctx, chosen, standby, v, caps, cluster)))
            except ValueError:
                pass
        if not cluster.links:  # with a slow link, link_candidates re-weights the relinked variants
            alone = (lambda p: link_time(ctx, p, cluster, self.evaluator)) if self.dag_top > 0 else None
            out += resplit_candidates(ctx, out, cluster, alone)
        return link_candidates(ctx, out, cluster, self.evaluator, lean=self._large(ctx))

    def _balanced(self, ctx, chosen, standby, v, caps, cluster, rounds: int = 3) -> Plan:
        """The "balance" candidate: per-stage makespan migration, then one min-max split on the
        per-stage makespans it leaves. Memory depends on the split and the split on the moves, so
        the moves are first made unconstrained (on a placeholder split), then again under the
        exact memory check at the split they gave (`chunk_memory_check`), until the split stays
        (at most `rounds` times): the moves returned always fit at the split returned."""
        dp, pp, L = ctx.dp, ctx.pp, ctx.model.num_layers
        draft = assemble(ctx, chosen, [(1,) * (pp - 1) + (L - pp + 1,)] * dp, standby)
        costs = microbatch_costs(ctx, draft)
        live_caps = [min(caps[(d, i)] for d in range(dp) if v[(d, i)] > 0) for i in range(pp)]
        mem_ok, counts = None, None
        for _ in range(rounds + 1):
            eff, moves = self._stage_moves(ctx, v, costs, draft.microbatches, mem_ok)
            new = minmax_partition(L, eff, live_caps, last_cost=head_layers(ctx.model))
            if mem_ok is not None and new == counts:
                break
            counts = new
            draft = assemble(ctx, chosen, [counts] * dp, standby)
            mem_ok = chunk_memory_check(ctx, draft)
        else:
            eff, moves = self._stage_moves(ctx, v, costs, draft.microbatches, mem_ok)  # at `counts`
        return draft.to_plan(sorted(moves))

    def _stage_moves(self, ctx, v, costs, microbatches, mem_ok) -> tuple[list[float], list[tuple]]:
        """(per-stage effective speed, moves) of `balance_stage` at every stage; `mem_ok(group,
        counts)` as in migrate.py, None for no memory check."""
        dp, pp = ctx.dp, ctx.pp
        eff, moves = [], []
        for i in range(pp):
            scale = {d: 1.0 / v[(d, i)] if v[(d, i)] > 0 else math.inf for d in range(dp)}
            chunks = [(d, (d, j), costs[d][j]) for d in range(dp) for j in range(microbatches[d])]
            if len(set(scale.values())) == 1:  # equal replicas: nothing to balance at this stage
                eff.append(1.0 / max(sum(costs[d]) * scale[d] for d in range(dp)))
                continue
            mean = sum(c for _, _, c in chunks) / sum(1 / s for s in scale.values() if math.isfinite(s))
            ok = None if mem_ok is None else (lambda d, counts, i=i: mem_ok((d, i), counts))
            where = balance_stage(scale, chunks, ok, self.min_gain * mean)
            eff.append(1.0 / stage_bottleneck(scale, chunks, where))
            moves += [(d, j, i, g) for (d, j), g in where.items() if g != d]
        return eff, moves

    def _iterations(self, ctx) -> tuple[int, ...]:
        """The packed batches a candidate is priced on: the first `samples` iterations' (default
        3, or 1 for a global batch of SPREAD_MICROBATCHES or more, whose own spread averages the
        length variation), so the choice follows the expected rate, not one batch's packing."""
        n = (
            self.samples
            if self.samples is not None
            else (1 if ctx.global_microbatches >= SPREAD_MICROBATCHES else 3)
        )
        return tuple(range(1, n + 1))

    def _large(self, ctx) -> bool:
        """More stage-chunks per iteration than `large_chunks`: no paper or migration candidates."""
        return ctx.global_microbatches * ctx.pp > self.large_chunks

    def _include_paper(self, ctx) -> bool:
        """Run the paper's planner as a candidate (default: unless the job is large, see `_large`)."""
        return not self._large(ctx) if self.include_paper is None else self.include_paper

    def _score(self, it: float, pause_s: float):
        if math.isinf(self.horizon_s):
            return (-it, -pause_s)
        return (max(0.0, self.horizon_s - pause_s) / it, -it)

    def choose_plan(self, ctx, plan: Plan, cluster) -> tuple[str, Plan, float, object]:
        """(label, plan, predicted iteration s, reconfig) of the best-scoring candidate (`_best`)."""
        return self._best(ctx, plan, self.candidates(ctx, plan, cluster), cluster)

    def _ranked(self, ctx, plan: Plan, cands, cluster):
        """(ranked, top): the feasible `cands` ([(label, plan)]) as [(proxy score, label, plan,
        reconfig from `plan`)], best first (stable: ties keep the candidates' order), and how many
        of them at most get the full ITP pass.

        `proxy_time` mostly under-estimates the ITP (it leaves out communication, bubbles beyond
        one fill and ordering stalls), so the score it gives is an optimistic bound; `dag_top`
        caps the passes (0: trust the proxy alone); while a link is slow every candidate is
        costed (the proxy is blind to links), except on large jobs."""
        ranked = []

        def bound(cand):  # (proxy score, reconfig), None when it does not fit
            if not fits_memory(ctx, cand):
                return None
            rc = reconfig_cost(ctx, plan, cand, cluster, self.planning_s)
            return self._score(proxy_time(ctx, cand, cluster), rc.pause_s), rc

        bound = by_plan(bound)
        for label, cand in cands:
            got = bound(cand)
            if got is not None:
                ranked.append((got[0], label, cand, got[1]))
        ranked.sort(key=lambda r: r[0], reverse=True)
        top = len(ranked) if cluster.links and not self._large(ctx) else self.dag_top
        return ranked, top

    def _priced(self, ctx, cand: Plan, rc, cluster) -> tuple[tuple, float]:
        """(score, predicted iteration s) of `cand` by the full ITP pass (the proxy if dag_top = 0)."""
        if self.dag_top <= 0:
            it = proxy_time(ctx, cand, cluster)
        else:
            it = link_time(ctx, cand, cluster, self.evaluator, self._iterations(ctx))
        return self._score(it, rc.pause_s), it

    def _best(self, ctx, plan: Plan, cands, cluster) -> tuple[str, Plan, float, object]:
        """The best of `cands` ([(label, plan)]) for switching from `plan` on `cluster`: candidates
        get the full ITP pass in order of their proxy bound (`_ranked`), skipping those whose bound
        cannot beat the best costed plan; the paper's plan, when a candidate, is always costed, so
        `resihp` never scores below it. Of equal scores the earlier candidate wins."""
        ranked, top = self._ranked(ctx, plan, cands, cluster)
        if not ranked:
            raise ValueError("no feasible plan for the live devices")
        best = None
        priced = by_plan(lambda cand, rc: self._priced(ctx, cand, rc, cluster))  # equal plan: equal rc
        for k, (bound, label, cand, rc) in enumerate(ranked):
            pruned = best is not None and (k >= max(top, 1) or bound <= best[0])
            if pruned and label != "paper":  # the paper's plan is always costed: never worse
                continue
            score, it = priced(cand, rc)
            if best is None or score > best[0]:
                best = (score, label, cand, it, rc)
        return best[1], best[2], best[3], best[4]

    def cost_options(self, view) -> dict:
        """PP transfers over the CPU path while a slow link is known (links.py)."""
        return link_options(view)

    def wins(self, ctx, plan: Plan, new: Plan, others, cluster) -> bool:
        """`new` scores above keeping `plan` and above each of `others` on `cluster` (a tie goes to
        the rival). Rivals are priced as in `_best` (`_ranked`): in order of their proxy bound,
        while it reaches `new`'s score (keeping `plan` and the paper's plan always); the first
        that reaches `new`'s score ends the check."""
        rc_new = reconfig_cost(ctx, plan, new, cluster, self.planning_s)
        priced = by_plan(lambda cand, rc: self._priced(ctx, cand, rc, cluster))  # equal plan: equal rc
        mine, _ = priced(new, rc_new)
        ranked, top = self._ranked(ctx, plan, [("keep", plan), *others], cluster)
        for k, (bound, label, cand, rc) in enumerate(ranked):
            if label not in ("keep", "paper") and (k >= top or bound < mine):
                continue
            if priced(cand, rc)[0] >= mine:
                return False
        return True

    def decide(self, ctx, plan, cluster, reports) -> Decision:
        try:
            cands = self.candidates(ctx, plan, cluster)
            label, new, it, rc = self._best(ctx, plan, cands, cluster)
        except ValueError as exc:
            return Decision(None, reason=f"abort: {exc}")
        if new is plan or same_work(new, plan):
            new = plan
        else:
            new = new.with_changes(generation=plan.generation + 1, schedule=plan.schedule)
        return Decision(new, rc, it, f"resihp: {label}", weighed=tuple(cands))
