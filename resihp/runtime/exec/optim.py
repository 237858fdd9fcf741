"""The optimizer of a stage shard: fp32 AdamW, weight decay on matrices only; the learning-rate
schedule and the gradient-norm clipping applied before each step.

The runtime's workers and the single-process reference (`runtime/reference.py`) build it alike
and ask these functions for the rate and the clipping factor, so both apply the same math. AdamW
is element-wise, so stepping shards equals stepping the full tensors; the global gradient norm
is the one thing a step needs from every device. Each device adds the squares of the gradient
elements it owns alone (`sharding.owned_sq_sum` inside a TP group, the first holder of each
gradient segment across replicas, `owned_names`), in float64, and one all-reduce over the plan's
devices gives the norm of the whole model, every element counted once — however uneven the TP
splits, and a tied LM head (a copy of the embedding) not at all.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from resihp.core.plan import Plan
from resihp.core.segments import grad_segments
from resihp.model import layer_param_names

from ..job import OptimConfig

CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s: factor = max_norm / (norm + 1e-6)


def is_decayed(name: str, param: torch.Tensor) -> bool:
    """Weight decay for 2-D weights (projections, embedding, LM head); none for norms and biases."""
    return param.ndim >= 2


def build_optimizer(named_params: Iterable[tuple[str, nn.Parameter]], cfg: OptimConfig) -> torch.optim.AdamW:
    """fp32 AdamW over `named_params` (e.g. `stage.named_parameters()`), two groups by `is_decayed`."""
    decay, plain = [], []
    for name, p in named_params:
        (decay if is_decayed(name, p) else plain).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": plain, "weight_decay": 0.0}]
    return torch.optim.AdamW(
        [g for g in groups if g["params"]], lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, foreach=False
    )


def learning_rate(cfg: OptimConfig, iteration: int) -> float:
    """The rate of the step that applies iteration `iteration`'s gradient (0-based, absolute, so a
    resumed run continues the schedule): `lr · (k + 1) / warmup_iters` during warm-up, then `lr`,
    or with `cosine` `min_lr + (lr - min_lr) · (1 + cos(π · progress)) / 2`, progress going from
    0 at the end of warm-up to 1 at `decay_iters`, `min_lr` from there on."""
    if iteration < cfg.warmup_iters:
        return cfg.lr * (iteration + 1) / cfg.warmup_iters
    if cfg.schedule == "constant":
        return cfg.lr
    progress = min(1.0, (iteration - cfg.warmup_iters) / (cfg.decay_iters - cfg.warmup_iters))
    return cfg.min_lr + (cfg.lr - cfg.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def set_learning_rate(opt: torch.optim.Optimizer, cfg: OptimConfig, iteration: int) -> float:
    """Give every parameter group iteration `iteration`'s rate; returns it."""
    lr = learning_rate(cfg, iteration)
    for group in opt.param_groups:
        group["lr"] = lr
    return lr


def clip_coefficient(norm: float, max_norm: float) -> float:
    """The factor gradients are scaled by (1: no clipping), as `clip_grad_norm_` computes it."""
    if max_norm <= 0:
        return 1.0
    return min(1.0, max_norm / (norm + CLIP_EPS))


def owned_names(plan: Plan, replica: int, stage: int) -> list[str]:
    """Canonical names whose gradient norm this stage counts: those of every gradient segment it
    is the first holder of (after the reduction all holders hold the same gradient), without a
    tied LM head (it equals the embedding). The stage's TP ranks then split them by
    `owned_sq_sum`."""
    spec, out = plan.model, []
    for seg in grad_segments(plan):
        if seg.groups[0] != (replica, stage):
            continue
        out += ["embed.weight"] if seg.with_embedding else []
        for k in range(*seg.layers):
            out += layer_param_names(spec, k)
        if seg.with_head:
            out += ["norm.weight"] + ([] if spec.tie_word_embeddings else ["lm_head.weight"])
    return out
