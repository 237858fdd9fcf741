"""Canonical tensor names and shapes, and exact TP slicing / gathering of them.

Every tensor of the full model has a canonical name (`embed.weight`, `layers.{k}.attn.wq`, ...,
`norm.weight`, `lm_head.weight`); a stage module's `state_dict()` uses the same names with shard
shapes. Weights follow `nn.Linear` layout: (out_features, in_features).

A TP shard `rank` of a layer under `tp_split` (query heads per rank) and `ffn_split` (FFN columns
per rank) holds a contiguous range of query heads, the kv heads those query heads read (a kv head
whose query group straddles two shards is *replicated* on both), a contiguous range of FFN columns,
and full copies of the two RMSNorm weights. Embedding, final norm and LM head are never sharded.

The same slicing applies to anything shaped like the parameters: gradients and Adam moments.
Gathering has two modes:
  * `"copy"`: replicated entries are equal copies (parameters, Adam moments); take one.
  * `"sum"`: gradients. Inside a layer each TP rank sees only its own branch, so the gradients of
    the replicated layer entries (the two norm weights, replicated kv rows) are *partial* and the
    full gradient is their sum. Embedding, final norm and LM head are computed whole on every
    rank, so their gradients are complete and copied in either mode.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from resihp.core.model_spec import ModelSpec
from resihp.core.shard_layout import (  # noqa: F401  (re-exported: `resihp.model`'s names)
    _index,
    _rule,
    ffn_range,
    full_shape,
    head_range,
    kv_is_replicated,
    kv_range,
    layer_param_names,
    normalize_split,
    shard_range,
    stage_param_names,
)


def owned_range(spec: ModelSpec, name: str, tp_split, ffn_split, rank: int) -> tuple[int, int, int] | None:
    """(dim, start, stop) in the full tensor of the elements of shard `rank` that TP rank `rank` owns
    alone; None when it owns none. The ranks of a stage partition each full tensor this way.

    Sharded query / FFN rows and columns belong to their only holder; a kv head held by several
    shards (its query group straddles them) to the lowest; a replicated tensor (norms, embedding,
    LM head) to rank 0, whole. Used for the global gradient norm (`owned_sq_sum`) and for the
    disjoint chunks of a checkpoint (`runtime/state/chunks.py`).
    """
    tp_split, ffn_split = normalize_split(spec, tp_split, ffn_split)
    rule = _rule(name)
    if rule is None:
        return (0, 0, full_shape(spec, name)[0]) if rank == 0 else None
    dim, a, b = _index(spec, name, tp_split, ffn_split, rank)
    if rule[1] == "kv" and rank > 0:  # lower ranks own the kv heads below their stop
        a = max(a, _index(spec, name, tp_split, ffn_split, rank - 1)[2])
    return (dim, a, b) if b > a else None


def owned_sq_sum(
    spec: ModelSpec, name: str, shard: torch.Tensor, tp_split, ffn_split, rank: int
) -> torch.Tensor:
    """Sum of squares of the elements of `shard` that TP rank `rank` owns alone (`owned_range`), so
    that the sum over the ranks of a stage counts every element once. Used for the global gradient
    norm (`exec/optim.py`)."""
    own = owned_range(spec, name, tp_split, ffn_split, rank)
    if own is None:
        return shard.new_zeros(())
    dim, a, b = own
    held = shard_range(spec, name, tp_split, ffn_split, rank)
    start = 0 if held is None else held[1]
    return shard.narrow(dim, a - start, b - a).pow(2).sum()


def slice_tensor(
    spec: ModelSpec, name: str, full: torch.Tensor, tp_split, ffn_split, rank: int
) -> torch.Tensor:
    """Shard `rank` of the full tensor `name` (a contiguous copy, never a view)."""
    tp_split, ffn_split = normalize_split(spec, tp_split, ffn_split)
    idx = _index(spec, name, tp_split, ffn_split, rank)
    if idx is None:
        return full.detach().clone()
    dim, a, b = idx
    return full.detach().narrow(dim, a, b - a).clone()


def gather_tensor(
    spec: ModelSpec, name: str, shards: Sequence[torch.Tensor], tp_split, ffn_split, mode: str = "copy"
) -> torch.Tensor:
    """The full tensor `name` from every shard's piece (`shards[r]` of rank r); see module doc for mode."""
    assert mode in ("copy", "sum"), mode
    tp_split, ffn_split = normalize_split(spec, tp_split, ffn_split)
    assert len(shards) == len(tp_split), (len(shards), tp_split)
    rule = _rule(name)
    if rule is None:
        if mode == "sum" and name.startswith("layers."):
            return torch.stack([s.detach() for s in shards]).sum(0)
        return shards[0].detach().clone()
    full = shards[0].new_zeros(full_shape(spec, name))
    for r, piece in enumerate(shards):
        dim, a, b = _index(spec, name, tp_split, ffn_split, r)
        view = full.narrow(dim, a, b - a)
        if mode == "sum" and rule[1] == "kv":
            view.add_(piece.detach())
        else:
            view.copy_(piece.detach())
    return full


def slice_state(
    spec: ModelSpec, full: Mapping[str, torch.Tensor], tp_split, ffn_split, rank: int, names=None
) -> dict[str, torch.Tensor]:
    """Shard `rank` of every tensor in `full` (or of `names` only)."""
    names = list(full) if names is None else list(names)
    return {n: slice_tensor(spec, n, full[n], tp_split, ffn_split, rank) for n in names}


def gather_state(
    spec: ModelSpec, shards: Sequence[Mapping[str, torch.Tensor]], tp_split, ffn_split, mode: str = "copy"
) -> dict[str, torch.Tensor]:
    """Full tensors from one state dict per TP rank (all with the same names)."""
    return {n: gather_tensor(spec, n, [s[n] for s in shards], tp_split, ffn_split, mode) for n in shards[0]}


def _sync_names(spec: ModelSpec, names, tp_split) -> list[str]:
    """Layer tensors whose gradient is partial per TP rank: norm weights, and kv when replicated."""
    if len(tp_split) == 1:
        return []
    kv = kv_is_replicated(spec, tp_split)
    out = []
    for n in names:
        rule = _rule(n) if n.startswith("layers.") else "global"
        if rule is None or (rule != "global" and kv and rule[1] == "kv"):
            out.append(n)
    return out


def tp_grad_buffer(
    spec: ModelSpec, grads: Mapping[str, torch.Tensor], tp_split, ffn_split, rank: int
) -> torch.Tensor | None:
    """Rank `rank`'s flat contribution to the TP-group sum of partial gradients (None: nothing to sync).

    Norm weight gradients enter whole; kv gradients enter zero-padded to the full kv rows, so the
    element-wise sum over the TP group is exactly the `"sum"` gather of the partial entries.
    """
    tp_split, ffn_split = normalize_split(spec, tp_split, ffn_split)
    parts = []
    for n in _sync_names(spec, grads, tp_split):
        idx = _index(spec, n, tp_split, ffn_split, rank)
        if idx is None:
            parts.append(grads[n].reshape(-1))
            continue
        full = grads[n].new_zeros(full_shape(spec, n))
        dim, a, b = idx
        full.narrow(dim, a, b - a).copy_(grads[n])
        parts.append(full.reshape(-1))
    return torch.cat(parts) if parts else None


def apply_tp_grad_buffer(
    spec: ModelSpec, grads: Mapping[str, torch.Tensor], buffer: torch.Tensor, tp_split, ffn_split, rank: int
) -> None:
    """Write the summed buffer (from `tp_grad_buffer`, summed over the group) back into `grads` in place."""
    tp_split, ffn_split = normalize_split(spec, tp_split, ffn_split)
    offset = 0
    for n in _sync_names(spec, grads, tp_split):
        shape = full_shape(spec, n)
        numel = int(torch.Size(shape).numel())
        full = buffer[offset : offset + numel].view(shape)
        offset += numel
        idx = _index(spec, n, tp_split, ffn_split, rank)
        grads[n].copy_(full if idx is None else full.narrow(idx[0], idx[1], idx[2] - idx[1]))
    assert offset == buffer.numel(), (offset, buffer.numel())


def sync_tp_grads(
    spec: ModelSpec,
    grads: Mapping[str, torch.Tensor],
    tp_split,
    ffn_split,
    rank: int,
    all_reduce: Callable[[torch.Tensor], None],
) -> None:
    """Make the partial gradients of replicated layer entries complete, with one in-place sum collective.

    `all_reduce(t)` must sum `t` in place over the TP group (the runtime passes a process-group
    all-reduce). Afterwards every rank's gradients are the slices of the full gradient.
    """
    buffer = tp_grad_buffer(spec, grads, tp_split, ffn_split, rank)
    if buffer is not None:
        all_reduce(buffer)
        apply_tp_grad_buffer(spec, grads, buffer, tp_split, ffn_split, rank)
