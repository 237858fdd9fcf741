"""Oobleck (baselines.md §2.4): heterogeneous pipelines re-instantiated from templates.

Failure unit = the TP group (ResiHP's comparison). After a fail-stop or re-join, the surviving
whole TP groups ("units") are re-covered by pipelines built from templates (k units, layers split
evenly over k stages, k >= the smallest template that fits memory); we try the pipeline counts
around the original DP degree, give each pipeline a share of the global batch in proportion to
its throughput (whole micro-batches), and keep the plan the DAG predicts fastest, with at least
as many pipelines as at the start when the units allow (f + 1 pipelines tolerate f failures). Missing layers
are copied from other pipelines (no checkpoints): it aborts when no template fits the survivors or
every copy of some layer was lost. Cost: rebuild 2 s + engine re-instantiation 30 s + copies.
Fail-slows: no action (the strengthened variant adds Greyhound's ladder).
"""

from __future__ import annotations

from functools import lru_cache

from resihp.core.plan import Plan, build_stage, even_split, split_by_weight
from resihp.sched.base import Decision, Policy
from resihp.sched.detector import DetectorSpec
from resihp.sched.model import fits_memory

from .common import OOBLECK_REINIT_S, alone_time, resplit, switch, unchanged


def units(ctx, view) -> list[tuple[int, ...]]:
    """Initial TP groups whose devices are all alive."""
    plan0 = ctx.home
    return sorted(
        st.devices for stages in plan0.replicas for st in stages if all(view.alive[x] for x in st.devices)
    )


@lru_cache(maxsize=32)
def smallest_template(ctx) -> int:
    """Fewest stages a pipeline of whole TP groups needs to fit memory (one replica's batch)."""
    for k in range(1, ctx.model.num_layers + 1):
        plan = Plan.uniform(ctx.model, ctx.tp, k, 1, ctx.workload.num_microbatches, ctx.schedule)
        if fits_memory(ctx, plan):
            return k
    return ctx.model.num_layers + 1


def build(ctx, view, groups, sizes, speed_aware: bool) -> Plan:
    replicas, weights, at = [], [], 0
    split = {k: even_split(ctx.model.num_layers, k) for k in set(sizes)}
    for k in sizes:
        mine, at = groups[at : at + k], at + k
        bounds = [sum(split[k][:i]) for i in range(k + 1)]
        stages = tuple(build_stage(ctx.model, g, (bounds[i], bounds[i + 1])) for i, g in enumerate(mine))
        slowest = min(view.speed[x] for g in mine for x in g)
        if speed_aware:
            stages = resplit(ctx, stages, view)
        replicas.append(stages)
        weights.append(k * (slowest if speed_aware else 1.0))
    mbs = split_by_weight(ctx.global_microbatches, weights, 1)
    return Plan(ctx.model, tuple(replicas), mbs, ctx.schedule)


def pipelines_time(ctx, plan: Plan, view) -> float:
    """Iteration time as the slowest pipeline run alone (pipelines meet only at the gradient sync):
    one small DAG per distinct pipeline instead of one over the whole cluster."""
    cache: dict = {}
    return max(
        alone_time(ctx, st, m, plan.schedule, view, cache) for st, m in zip(plan.replicas, plan.microbatches)
    )


def instantiate(ctx, view, speed_aware: bool = False) -> Plan | None:
    """The fastest heterogeneous set of pipelines covering the surviving units; None if none fits."""
    groups = units(ctx, view)
    kmin = smallest_template(ctx)
    n_units = len(groups)
    if n_units < kmin or ctx.global_microbatches < 1:
        return None
    most = min(n_units // kmin, ctx.global_microbatches)
    least = min(ctx.dp, most)  # f + 1 pipelines tolerate f failures: keep the original count if possible
    center = max(least, round(n_units / ctx.pp))
    best, best_rate = None, 0.0
    for n in range(max(least, center - 2), min(most, center + 2) + 1):
        sizes = even_split(n_units, n)
        if min(sizes) < kmin or max(sizes) > ctx.model.num_layers:
            continue
        plan = build(ctx, view, groups, sizes, speed_aware)
        rate = plan.global_microbatches / pipelines_time(ctx, plan, view)
        if rate > best_rate:
            best, best_rate = plan, rate
    return best


def layers_survive(ctx, plan: Plan, view) -> bool:
    """Every layer is still held by some live group of `plan` (Oobleck copies, never reloads)."""
    held = set()
    for stages in plan.replicas:
        for st in stages:
            if st.devices and all(view.alive[x] for x in st.devices):
                held.update(range(*st.layers))
    return len(held) == ctx.model.num_layers


class Oobleck(Policy):
    """Oobleck: heterogeneous pipelines re-instantiated from templates after fail-stops."""

    name = "oobleck"
    speed_aware = False

    def detector(self, ctx) -> DetectorSpec:
        return DetectorSpec(stop_s=1.5)  # agent TCP channel drops: 1 s + the broadcast

    def decide(self, ctx, plan, cluster, reports) -> Decision:
        if not any(r.kind in ("fail-stop", "rejoin") for r in reports):
            return unchanged(plan)
        if not layers_survive(ctx, plan, cluster):
            return Decision(None, reason="every copy of some layer was lost")
        new = instantiate(ctx, cluster, self.speed_aware)
        if new is None:
            return Decision(None, reason="no pipeline template fits the surviving units")
        if new.replicas == plan.replicas and new.microbatches == plan.microbatches:
            return unchanged(plan)
        return switch(ctx, plan, new, cluster, "re-instantiate pipeline templates", OOBLECK_REINIT_S)
