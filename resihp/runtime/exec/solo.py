"""One member in this process: the executor (`Worker`) on a single-device plan, without processes.

A tp 1 x pp 1 x dp 1 plan has no group and no P2P, so its worker needs no process group: the same
instruction list, stage, optimizer, precision, attention, timing and injection as a member of
`resihp train`, minus the controller. The tests check the executor's numerics with it (bf16,
activation checkpointing, injected slowness), and `benchmarks/gpu_check.py` measures a GPU's
parity and throughput through it.
"""

from __future__ import annotations

from dataclasses import dataclass

from resihp.core.plan import Plan
from resihp.model.loss import iteration_loss

from ..job import JobSpec
from .groups import build_groups
from .iteration import Hooks
from .worker import Worker


@dataclass
class Solo:
    """A finished solo run: per-iteration mean CE per target (the reference's `loss`), the trace
    records, and the worker (its final state: `worker.named`)."""

    losses: list[float]
    records: list[dict]
    worker: Worker


def run_solo(plan: Plan, job: JobSpec, iterations: int | None = None, hooks: Hooks | None = None) -> Solo:
    """Iterations `[job.start_iteration, + iterations (default job.iterations))` of `plan` (one device)."""
    assert len(plan.devices()) == 1, f"a solo run has one device, the plan has {plan.devices()}"
    device = plan.devices()[0]
    worker = Worker(plan, device, build_groups(plan, device), job, hooks=hooks)
    losses, records = [], []
    n = job.iterations if iterations is None else iterations
    g, seq_len = plan.global_microbatches, job.workload.seq_len
    for it in range(job.start_iteration, job.start_iteration + n):
        rec = worker.run_iteration(it)
        rows = rec["losses"]
        losses.append(iteration_loss(sum(r.loss for r in rows), g, seq_len, sum(r.targets for r in rows)))
        records.append(rec)
    return Solo(losses, records, worker)
