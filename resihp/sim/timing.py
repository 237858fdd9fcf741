"""Iteration time of a plan on a cluster, averaged over a few sampled packed batches, cached.

The job simulator asks the same question ("how fast does this plan run on this cluster?") many
times between events; the answer depends only on (plan, cluster, cost options), so it is cached.
Sequence-length variation enters by averaging the predicted iteration time over `samples` packed
global batches drawn at seeded iteration indices (cost-model.md §9.3); by default 3, or 1 when the
global batch has >= 256 micro-batches (its own spread then averages the variation).
"""

from __future__ import annotations

import random

from resihp.core.cluster import Cluster
from resihp.core.plan import Plan
from resihp.core.scenario import Job
from resihp.evaluator.predict import predict
from resihp.sched.model import SPREAD_MICROBATCHES, pipeline_key


def _iteration_s(job, plan: Plan, cluster: Cluster, iteration: int, **options) -> float:
    return predict(job, plan, cluster, iteration, **options).iteration_s


class PlanTimer:
    """Mean predicted iteration seconds of (plan, cluster) over `samples` seeded iterations."""

    def __init__(self, job: Job, seed: int = 0, samples: int | None = None):
        if samples is None:  # a large global batch already averages its own length variation
            samples = 3 if job.global_microbatches < SPREAD_MICROBATCHES else 1
        if samples < 1:
            raise ValueError(f"samples = {samples!r}: must be >= 1")
        rng = random.Random(f"timer:{seed}")
        self.job = job
        self.iterations = tuple(rng.randrange(1_000_000) for _ in range(samples))
        self._run = _iteration_s
        self._cache: dict = {}

    def iteration_s(
        self, plan: Plan, cluster: Cluster, options: dict | None = None, quick: bool = False
    ) -> float:
        """Mean over the sampled iterations. `quick` (for pricing choices): the first sample only,
        and for plans of >= 8 whole replicas the slowest pipeline run alone (no gradient sync)."""
        if quick and plan.dp >= 8 and not plan.assignment:
            if not any(st.hollow for r in plan.replicas for st in r):
                return self._slowest_pipeline_s(plan, cluster, options or {})
        quick = quick and len(self.iterations) > 1
        key = (plan, cluster, tuple(sorted((options or {}).items())), quick)
        hit = self._cache.get(key)
        if hit is None:
            opts = dict(key[2])
            its = self.iterations[:1] if quick else self.iterations
            times = [self._run(self.job, plan, cluster, it, **opts) for it in its]
            hit = self._cache[key] = sum(times) / len(times)
        return hit

    def _slowest_pipeline_s(self, plan: Plan, cluster: Cluster, options: dict) -> float:
        """The slowest pipeline run alone, shared among pipelines of the same `pipeline_key`."""
        worst = 0.0
        for stages, m in zip(plan.replicas, plan.microbatches):
            key = ("alone", pipeline_key(stages, m, cluster), tuple(sorted(options.items())))
            if key not in self._cache:
                alone = Plan(plan.model, (stages,), (m,), plan.schedule)
                self._cache[key] = self._run(self.job, alone, cluster, self.iterations[0], **options)
            worst = max(worst, self._cache[key])
        return worst

    def samples_per_s(
        self, plan: Plan, cluster: Cluster, options: dict | None = None, quick: bool = False
    ) -> float:
        """Throughput (one micro-batch = one sample); 0 if the plan uses a dead device."""
        if any(not cluster.alive[d] for d in plan.devices()):
            return 0.0
        return plan.global_microbatches / self.iteration_s(plan, cluster, options, quick)
