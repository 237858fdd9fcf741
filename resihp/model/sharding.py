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

# suffix after "layers.{k}." -> (sharded dim, what splits it); None = replicated
_LAYER_RULES: dict[str, tuple[int, str] | None] = {
    "attn_norm.weight": None,
    "attn.wq": (0, "q"),
    "attn.bq": (0, "q"),
    "attn.wk": (0, "kv"),
    "attn.bk": (0, "kv"),
    "attn.wv": (0, "kv"),
    "attn.bv": (0, "kv"),
    "attn.wo": (1, "q"),
    "mlp_norm.weight": None,
    "mlp.w_gate": (0, "ffn"),
    "mlp.w_up": (0, "ffn"),
    "mlp.w_down": (1, "ffn"),
}


def layer_param_names(spec: ModelSpec, k: int) -> list[str]:
    """Canonical names of layer k's tensors, in a fixed order."""
    suffixes = [s for s in _LAYER_RULES if spec.qkv_bias or s not in ("attn.bq", "attn.bk", "attn.bv")]
    return [f"layers.{k}.{s}" for s in suffixes]


def stage_param_names(spec: ModelSpec, layers: tuple[int, int]) -> list[str]:
    """Canonical names held by a stage of layers [lo, hi): embedding first, head last."""
    lo, hi = layers
    names = ["embed.weight"] if lo == 0 else []
    for k in range(lo, hi):
        names += layer_param_names(spec, k)
    if hi == spec.num_layers:
        names += ["norm.weight", "lm_head.weight"]
    return names


def full_shape(spec: ModelSpec, name: str) -> tuple[int, ...]:
    """Shape of the unsharded tensor called `name`."""
    h, q, kv, f = spec.hidden, spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim, spec.ffn
    if name in ("embed.weight", "lm_head.weight"):
        return (spec.vocab, h)
    suffix = _suffix(name)
    return {
        "norm.weight": (h,),
        "attn_norm.weight": (h,),
        "mlp_norm.weight": (h,),
        "attn.wq": (q, h),
        "attn.bq": (q,),
        "attn.wk": (kv, h),
        "attn.bk": (kv,),
        "attn.wv": (kv, h),
        "attn.bv": (kv,),
        "attn.wo": (h, q),
        "mlp.w_gate": (f, h),
        "mlp.w_up": (f, h),
        "mlp.w_down": (h, f),
    }[suffix]


def _suffix(name: str) -> str:
    if name.startswith("layers."):
        return name.split(".", 2)[2]
    return name


def _rule(name: str) -> tuple[int, str] | None:
    return _LAYER_RULES[_suffix(name)] if name.startswith("layers.") else None


def normalize_split(spec: ModelSpec, tp_split, ffn_split) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(tp_split, ffn_split) with `None` meaning one shard; ValueError when they do not tile."""
    tp_split = (spec.heads,) if tp_split is None else tuple(tp_split)
    ffn_split = (spec.ffn,) if ffn_split is None else tuple(ffn_split)
    if len(tp_split) != len(ffn_split):
        raise ValueError(f"tp_split {tp_split} and ffn_split {ffn_split} need the same length")
    if min(tp_split) < 1 or sum(tp_split) != spec.heads:
        raise ValueError(f"tp_split {tp_split}: entries >= 1 summing to {spec.heads} heads")
    if min(ffn_split) < 1 or sum(ffn_split) != spec.ffn:
        raise ValueError(f"ffn_split {ffn_split}: entries >= 1 summing to {spec.ffn} columns")
    return tp_split, ffn_split


def _range(split: Sequence[int], rank: int) -> tuple[int, int]:
    lo = sum(split[:rank])
    return lo, lo + split[rank]


def head_range(tp_split: Sequence[int], rank: int) -> tuple[int, int]:
    """Query heads [q0, q1) of shard `rank`."""
    return _range(tp_split, rank)


def kv_range(spec: ModelSpec, tp_split: Sequence[int], rank: int) -> tuple[int, int]:
    """kv heads [k0, k1) that shard `rank`'s query heads read (GQA group = heads // kv_heads)."""
    q0, q1 = head_range(tp_split, rank)
    group = spec.heads // spec.kv_heads
    return q0 // group, (q1 - 1) // group + 1


def ffn_range(ffn_split: Sequence[int], rank: int) -> tuple[int, int]:
    """FFN columns [f0, f1) of shard `rank`."""
    return _range(ffn_split, rank)


def kv_is_replicated(spec: ModelSpec, tp_split: Sequence[int]) -> bool:
    """Whether some kv head is held by more than one shard."""
    held = sum(b - a for a, b in (kv_range(spec, tp_split, r) for r in range(len(tp_split))))
    return held > spec.kv_heads


def _index(spec, name, tp_split, ffn_split, rank) -> tuple[int, int, int] | None:
    """(dim, start, stop) of shard `rank` inside the full tensor, None when replicated."""
    rule = _rule(name)
    if rule is None:
        return None
    dim, by = rule
    hd = spec.head_dim
    if by == "q":
        a, b = head_range(tp_split, rank)
        return dim, a * hd, b * hd
    if by == "kv":
        a, b = kv_range(spec, tp_split, rank)
        return dim, a * hd, b * hd
    a, b = ffn_range(ffn_split, rank)
    return dim, a, b


def shard_range(spec: ModelSpec, name: str, tp_split, ffn_split, rank: int) -> tuple[int, int, int] | None:
    """(dim, start, stop) of shard `rank` of tensor `name` in the full tensor; None: a full copy."""
    tp_split, ffn_split = normalize_split(spec, tp_split, ffn_split)
    return _index(spec, name, tp_split, ffn_split, rank)


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
