"""Single-process training of the whole model on the same micro-batches: the parity oracle.

Distributed runs (any Plan, any failures) must reproduce `train_reference`'s per-iteration losses
and final state to floating-point tolerance. The optimizer is the runtime's own (`exec.optim`:
fp32 AdamW with the hyper-parameters of `OptimConfig`), so both decay the same tensors. Only tests
and benchmarks import this module: production code never runs the oracle.
"""

from __future__ import annotations

import torch

from resihp.core.model_spec import ModelSpec
from resihp.core.workload import Workload
from resihp.model.loss import iteration_loss, microbatch_loss
from resihp.model.stage import build_stage

from .exec.data import iteration_microbatches
from .exec.optim import build_optimizer
from .job import OptimConfig


def train_reference(
    spec: ModelSpec,
    workload: Workload,
    global_microbatches: int,
    iterations: int,
    lr: float = OptimConfig.lr,
    seed: int = 0,
    weight_decay: float = OptimConfig.weight_decay,
    *,
    optim: OptimConfig | None = None,
    start_iteration: int = 0,
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """(mean CE per target token of each iteration, final full state dict).

    Iteration i (from `start_iteration`) trains on `workload.pack(i, global_microbatches)`; the
    model starts from `init_state(spec, seed)`. `optim` overrides lr/weight_decay when given.
    """
    cfg = optim or OptimConfig(lr=lr, weight_decay=weight_decay)
    model = build_stage(spec, seed=seed)
    opt = build_optimizer(model.named_parameters(), cfg)
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    losses = []
    try:
        for it in range(start_iteration, start_iteration + iterations):
            loss_sum, targets = 0.0, 0
            for mb in iteration_microbatches(workload, it, global_microbatches):
                logits = model(mb.input_ids, mb.segment_ids, mb.positions)  # (N, vocab)
                loss, n = microbatch_loss(logits, mb.target_ids, global_microbatches, workload.seq_len)
                loss.backward()
                loss_sum += loss.item()
                targets += n
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(iteration_loss(loss_sum, global_microbatches, workload.seq_len, targets))
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def reference_for(plan, config, iterations: int | None = None) -> tuple[list[float], dict[str, torch.Tensor]]:
    """`train_reference` of a runtime job: `plan`'s model and global batch, a `TrainConfig`'s
    workload, seed, optimizer and iteration count (or `iterations`) — the oracle of the parity tests."""
    return train_reference(
        plan.model,
        config.workload(),
        plan.global_microbatches,
        config.iterations if iterations is None else iterations,
        seed=config.seed,
        optim=config.optim(),
    )
