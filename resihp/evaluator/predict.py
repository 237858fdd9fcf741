"""Predicted iteration time and throughput of a Plan on a cluster: compile, cost, evaluate.

This is the paper's iteration-time predictor (ITP) with the analytical cost model, and what every
policy uses to compare candidate plans.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from resihp.core.cluster import Cluster
from resihp.core.plan import Plan
from resihp.core.program import Program, compile_plan
from resihp.core.scenario import Job
from resihp.core.workload import packed
from resihp.cost import build_costs

from .pipeline import IterationResult, evaluate


@dataclass(frozen=True)
class Prediction:
    iteration_s: float
    samples_per_s: float
    peak_memory_bytes: dict[int, float]
    result: IterationResult
    program: Program


def predict(
    job: Job, plan: Plan, cluster: Cluster, iteration: int = 0, keep_spans: bool = False, **cost_options
) -> Prediction:
    """Evaluate `plan` on the packed batch of `iteration` (each micro-batch is one sample)."""
    batch = packed(job.workload, iteration, plan.global_microbatches)
    tokens = np.full(batch.count, float(batch.seq_len))
    costs = build_costs(job.model, plan, cluster, tokens, batch.sum_sq, **cost_options)
    program = compile_plan(plan)
    result = evaluate(program, costs, keep_spans=keep_spans)
    return Prediction(
        result.iteration_s, plan.global_microbatches / result.iteration_s,
        result.peak_memory_bytes, result, program,
    )  # fmt: skip
