"""A pipeline stage: layers [lo, hi) of the model (one TP shard of them), plus the embedding if it
is the first stage and the final norm + LM head if it is the last.

The embedding and LM head are *not* TP-sharded: every member of the first (last) stage's TP group
holds a full replica and computes them whole, which keeps the vocabulary path simple (the tiny
models have a 256-token vocabulary). Parameter names are the canonical ones of `sharding`, so
`stage.state_dict()` plugs straight into `slice_state` / `gather_state`.

Activation checkpointing (`activation_checkpointing`, per transformer block): a block keeps only its
input during the forward and recomputes its activations in the backward (non-reentrant
`torch.utils.checkpoint`, so `autograd.grad` on chosen inputs — the zbh1 split of B and W — works;
each backward that needs them recomputes). The recomputation replays the block's TP collectives in
the same order on every rank of the group and the autocast state of the forward, and the layers draw
no random numbers, so results equal those without it (tests/model/test_checkpointing.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from resihp.core.model_spec import ModelSpec

from .attention import Docs
from .init import init_state
from .layers import DecoderLayer, Weight, identity, rms_norm, rope_tables
from .sharding import normalize_split, slice_state, stage_param_names


class StageModel(nn.Module):
    """Layers [lo, hi) as TP shard `tp_rank` of (tp_split, ffn_split); parameters start uninitialised."""

    def __init__(
        self, spec: ModelSpec, layers: tuple[int, int], tp_split=None, ffn_split=None, tp_rank: int = 0
    ) -> None:
        super().__init__()
        self.activation_checkpointing = False  # recompute each block's activations in the backward
        lo, hi = layers
        if not 0 <= lo < hi <= spec.num_layers:
            raise ValueError(f"layers {list(layers)}: need 0 <= lo < hi <= {spec.num_layers}")
        tp_split, ffn_split = normalize_split(spec, tp_split, ffn_split)
        if not 0 <= tp_rank < len(tp_split):
            raise ValueError(f"tp_rank {tp_rank}: need 0 <= tp_rank < {len(tp_split)}")
        self.spec, self.layer_range = spec, (lo, hi)
        self.tp_split, self.ffn_split, self.tp_rank = tp_split, ffn_split, tp_rank
        self.is_first, self.is_last = lo == 0, hi == spec.num_layers
        if self.is_first:
            self.embed = Weight(spec.vocab, spec.hidden)
        self.layers = nn.ModuleDict(
            {str(k): DecoderLayer(spec, tp_split, ffn_split, tp_rank) for k in range(lo, hi)}
        )
        if self.is_last:
            self.norm = Weight(spec.hidden)
            self.lm_head = Weight(spec.vocab, spec.hidden)

    def param_names(self) -> list[str]:
        return stage_param_names(self.spec, self.layer_range)

    def load_full_state(self, full: Mapping[str, torch.Tensor]) -> None:
        """Load this shard's slices of a full (unsharded) state dict."""
        own = slice_state(self.spec, full, self.tp_split, self.ffn_split, self.tp_rank, self.param_names())
        self.load_state_dict(own, strict=True)

    def forward(
        self,
        x: torch.Tensor,
        segment_ids: torch.Tensor,
        positions: torch.Tensor,
        *,
        docs: Docs | torch.Tensor | None = None,
        enter: Callable[[torch.Tensor], torch.Tensor] = identity,
        reduce: Callable[[torch.Tensor], torch.Tensor] = identity,
    ) -> torch.Tensor:
        """Token ids (N,) on the first stage, else hidden (N, h) -> logits (N, vocab) if last, else hidden.

        `docs`: the window's documents (`layers.Docs`; default: read off `segment_ids`, which waits
        for the device when they live on one), or a dense (N, N) mask (the tests' oracle).
        `enter` / `reduce` are the TP collectives described in `layers` (identity when unsharded).
        """
        if self.is_first:
            x = self.embed.weight[x]  # (N, h)
        spec = self.spec
        cos, sin = rope_tables(positions, spec.head_dim, spec.rope_theta, spec.rope_scaling)  # (N, hd) each
        docs = Docs.of(segment_ids) if docs is None else docs
        recompute = self.activation_checkpointing and torch.is_grad_enabled()
        for layer in self.layers.values():
            if recompute:  # no RNG in a block: nothing to preserve
                x = checkpoint(
                    layer, x, cos, sin, docs, enter, reduce, use_reentrant=False, preserve_rng_state=False
                )
            else:
                x = layer(x, cos, sin, docs, enter=enter, reduce=reduce)  # (N, h)
        if self.is_last:
            x = rms_norm(x, self.norm.weight, spec.rms_norm_eps)  # (N, h)
            x = x @ self.lm_head.weight.t()  # (N, vocab)
        return x


def build_stage(
    spec: ModelSpec,
    layers: tuple[int, int] | None = None,
    tp_split=None,
    ffn_split=None,
    tp_rank: int = 0,
    *,
    seed: int | None = None,
    state: Mapping[str, torch.Tensor] | None = None,
    shard: Mapping[str, torch.Tensor] | None = None,
) -> StageModel:
    """A stage initialised from a full state dict, from this rank's own `shard` tensors (already
    sliced, e.g. `hf.read_shard`), or from `init_state(spec, seed)` (only its tensors).

    `layers=None` means the whole model; pass exactly one of `seed`, `state` and `shard`.
    """
    if sum(x is not None for x in (seed, state, shard)) != 1:
        raise ValueError("build_stage: pass exactly one of seed=, state= and shard=")
    stage = StageModel(spec, layers or (0, spec.num_layers), tp_split, ffn_split, tp_rank)
    if shard is not None:
        stage.load_state_dict(dict(shard), strict=True)
        return stage
    if state is None:
        state = init_state(spec, seed, stage.param_names())
    stage.load_full_state(state)
    return stage
