"""Canonical tensor names and shapes, and where a TP shard lies in each tensor: torch-free.

The one source of the model's tensor layout for the torch model (`resihp.model.sharding`, which
slices and gathers tensors by these rules) and for planners that only count bytes
(`core.transfer_plan`). Every tensor has a canonical name (`embed.weight`,
`layers.{k}.attn.wq`, ..., `norm.weight`, `lm_head.weight`) and `nn.Linear` layout (out, in).
A TP shard is a contiguous range of one dimension (`shard_range`) or a full copy (norms,
embedding, LM head).
"""

from __future__ import annotations

from collections.abc import Sequence

from .model_spec import ModelSpec

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
