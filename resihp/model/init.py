"""Deterministic initialisation of the full (unsharded) model from a seed.

Each tensor draws from its own generator seeded by (seed, name), so any subset of tensors (one
stage's layers, say) can be initialised alone and still equals the same slice of the full model.
"""

from __future__ import annotations

import math
import zlib

import torch

from resihp.core.model_spec import ModelSpec

from .sharding import full_shape, stage_param_names

INIT_STD = 0.02


def _generator(seed: int, name: str) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**62))


def init_tensor(spec: ModelSpec, name: str, seed: int) -> torch.Tensor:
    """Tensor `name` of the full model: norms 1, biases 0, matrices N(0, 0.02²).

    Output projections (`attn.wo`, `mlp.w_down`) use std 0.02 / sqrt(2 · num_layers) so that the
    residual stream's variance does not grow with depth (GPT-2 scheme). With tied embeddings the
    LM head is drawn as the embedding (its generator is the embedding's): the two copies start equal.
    """
    if spec.tie_word_embeddings and name == "lm_head.weight":
        name = "embed.weight"
    shape = full_shape(spec, name)
    if name.endswith("norm.weight"):
        return torch.ones(shape)
    if name.split(".")[-1] in ("bq", "bk", "bv"):
        return torch.zeros(shape)
    std = INIT_STD
    if name.endswith(("attn.wo", "mlp.w_down")):
        std /= math.sqrt(2 * spec.num_layers)
    return torch.randn(shape, generator=_generator(seed, name)) * std


def init_state(spec: ModelSpec, seed: int, names=None) -> dict[str, torch.Tensor]:
    """Full fp32 state dict with canonical names (all tensors of the model, or only `names`)."""
    names = stage_param_names(spec, (0, spec.num_layers)) if names is None else names
    return {n: init_tensor(spec, n, seed) for n in names}
