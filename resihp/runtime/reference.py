"""Single-process training of the whole model on the same micro-batches: the parity oracle.

Distributed runs (any Plan, any failures) must reproduce `train_reference`'s per-iteration losses
and final state to floating-point tolerance. The optimizer is the runtime's own (`exec.optim`:
fp32 AdamW with the hyper-parameters of `OptimConfig`, its learning-rate schedule and clipping
factor), so both decay the same tensors at the same rates. What the runtime computes across
devices the oracle computes on the full model directly: a tied LM head's gradient is embedding +
head gradient, and the clipping norm is the L2 norm of every gradient (the tied head once).
Only tests and benchmarks import this module: production code never runs the oracle.
"""

from __future__ import annotations

import torch

from resihp.core.model_spec import ModelSpec
from resihp.core.workload import Workload
from resihp.model.loss import iteration_loss, microbatch_loss
from resihp.model.stage import build_stage

from .exec.data import iteration_microbatches
from .exec.optim import build_optimizer, clip_coefficient, set_learning_rate
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
    init: dict[str, torch.Tensor] | None = None,
    history: list | None = None,
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """(mean CE per target token of each iteration, final full state dict).

    Iteration i (from `start_iteration`) trains on `workload.pack(i, global_microbatches)`; the
    model starts from `init` (a full state dict, e.g. `hf.read_full`) or `init_state(spec, seed)`.
    `optim` overrides lr/weight_decay when given. `history`, when given, receives one dict per
    iteration: its learning rate and (with clipping) its gradient norm before clipping.
    """
    cfg = optim or OptimConfig(lr=lr, weight_decay=weight_decay)
    model = build_stage(spec, seed=seed) if init is None else build_stage(spec, state=init)
    named = dict(model.named_parameters())
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
            if spec.tie_word_embeddings:
                tied = named["embed.weight"].grad + named["lm_head.weight"].grad
                named["embed.weight"].grad, named["lm_head.weight"].grad = tied, tied.clone()
            row = {"lr": set_learning_rate(opt, cfg, it)}
            if cfg.grad_clip:
                counted = [
                    p for n, p in named.items() if not (spec.tie_word_embeddings and n == "lm_head.weight")
                ]
                norm = sum(float(p.grad.pow(2).sum().double()) for p in counted) ** 0.5
                scale = clip_coefficient(norm, cfg.grad_clip)
                if scale < 1.0:
                    for p in named.values():
                        p.grad.mul_(scale)
                row["grad_norm"] = norm
            if history is not None:
                history.append(row)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(iteration_loss(loss_sum, global_microbatches, workload.seq_len, targets))
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def reference_for(plan, config, iterations: int | None = None) -> tuple[list[float], dict[str, torch.Tensor]]:
    """`train_reference` of a runtime job: `plan`'s model and global batch, a `TrainConfig`'s
    workload, seed, optimizer and iteration count (or `iterations`) — the oracle of the parity tests."""
    weights = config.weights_dir()
    init = None
    if weights is not None:
        from resihp.model.hf import read_full

        init = read_full(weights, plan.model)
    return train_reference(
        plan.model,
        config.workload(),
        plan.global_microbatches,
        config.iterations if iterations is None else iterations,
        seed=config.seed,
        optim=config.optim(),
        init=init,
    )
