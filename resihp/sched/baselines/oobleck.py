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
from resihp.sched.model import fits_memory
from resihp.sim.detection import DetectorSpec

from .common import OOBLECK_REINIT_S, alone_time, resplit, switch, unchanged


def units(job, view) -> list[tuple[int, ...]]:
    """Initial TP groups whose devices are all alive."""
    plan0 = job.initial_plan()
    return sorted(
        st.devices for stages in plan0.replicas for st in stages if all(view.alive[x] for x in st.devices)
    )


@lru_cache(maxsize=32)
def smallest_template(job) -> int:
    """Fewest stages a pipeline of whole TP groups needs to fit memory (one replica's batch)."""
    for k in range(1, job.model.num_layers + 1):
        plan = Plan.uniform(job.model, job.tp, k, 1, job.workload.num_microbatches, job.schedule)
        if fits_memory(job, plan):
            return k
    return job.model.num_layers + 1


def build(job, view, groups, sizes, speed_aware: bool) -> Plan:
    replicas, weights, at = [], [], 0
    split = {k: even_split(job.model.num_layers, k) for k in set(sizes)}
    for k in sizes:
        mine, at = groups[at : at + k], at + k
        bounds = [sum(split[k][:i]) for i in range(k + 1)]
        stages = tuple(build_stage(job.model, g, (bounds[i], bounds[i + 1])) for i, g in enumerate(mine))
        slowest = min(view.speed[x] for g in mine for x in g)
        if speed_aware:
            stages = resplit(job, stages, view)
        replicas.append(stages)
        weights.append(k * (slowest if speed_aware else 1.0))
    mbs = split_by_weight(job.global_microbatches, weights, 1)
    return Plan(job.model, tuple(replicas), mbs, job.schedule)


def pipelines_time(job, plan: Plan, view) -> float:
    """Iteration time as the slowest pipeline run alone (pipelines meet only at the gradient sync):
    one small DAG per distinct pipeline instead of one over the whole cluster."""
    cache: dict = {}
    return max(
        alone_time(job, st, m, plan.schedule, view, cache) for st, m in zip(plan.replicas, plan.microbatches)
    )


def instantiate(job, view, speed_aware: bool = False) -> Plan | None:
    """The fastest heterogeneous set of pipelines covering the surviving units; None if none fits."""
    groups = units(job, view)
    kmin = smallest_template(job)
    n_units = len(groups)
    if n_units < kmin or job.global_microbatches < 1:
        return None
    most = min(n_units // kmin, job.global_microbatches)
    least = min(job.dp, most)  # f + 1 pipelines tolerate f failures: keep the original count if possible
    center = max(least, round(n_units / job.pp))
    best, best_rate = None, 0.0
    for n in range(max(least, center - 2), min(most, center + 2) + 1):
        sizes = even_split(n_units, n)
        if min(sizes) < kmin or max(sizes) > job.model.num_layers:
            continue
        plan = build(job, view, groups, sizes, speed_aware)
        rate = plan.global_microbatches / pipelines_time(job, plan, view)
        if rate > best_rate:
            best, best_rate = plan, rate
    return best


def layers_survive(job, plan: Plan, view) -> bool:
    """Every layer is still held by some live group of `plan` (Oobleck copies, never reloads)."""
    held = set()
    for stages in plan.replicas:
        for st in stages:
            if st.devices and all(view.alive[x] for x in st.devices):
                held.update(range(*st.layers))
    return len(held) == job.model.num_layers


class Oobleck(Policy):
    name = "oobleck"
    speed_aware = False

    def detector(self, job) -> DetectorSpec:
        return DetectorSpec(stop_s=1.5)  # agent TCP channel drops: 1 s + the broadcast

    def adapt(self, job, plan, cluster, reports) -> Decision:
        if not any(r.kind in ("fail-stop", "rejoin") for r in reports):
            return unchanged(plan)
        if not layers_survive(job, plan, cluster):
            return Decision(None, reason="every copy of some layer was lost")
        new = instantiate(job, cluster, self.speed_aware)
        if new is None:
            return Decision(None, reason="no pipeline template fits the surviving units")
        if new.replicas == plan.replicas and new.microbatches == plan.microbatches:
            return unchanged(plan)
        return switch(job, plan, new, cluster, "re-instantiate pipeline templates", OOBLECK_REINIT_S)
