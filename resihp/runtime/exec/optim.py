"""The optimizer of a stage shard: fp32 AdamW, weight decay on matrices only.

The runtime's workers and the single-process reference (`runtime/reference.py`) build it alike, so
both decay the same tensors; AdamW is element-wise, so stepping shards equals stepping the full
tensors.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from ..job import OptimConfig


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
