"""Per-device memory of a pipeline stage and the feasibility check (cost-model.md §2).

    M = P_dev·bytes_per_param + n_live·L_s·T·A_tok + [last] 4·T·V/t (fp32 logits)  <=  (1 - reserve)·HBM

P_dev counts the device's share of its stage's parameters: QKV/output projections by its query-head
share, SwiGLU matrices by its FFN-column share, the vocabulary-parallel embedding (first stage) and
LM head (last stage) split evenly over the TP group, norms replicated. A_tok is the LLaMA/Qwen
variant of Korthikanti et al. (FlashAttention, no dropout, SwiGLU, GQA), per layer per token:

    TP + SP: [8·h + 2·(2·h + 2·n_kv·d_h + 3·F)] / t        (default)
    TP only:  8·h + 2·(2·h + 2·n_kv·d_h + 3·F) / t

with the head-sized part scaled by the head share and the FFN part by the FFN share for uneven splits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from resihp.core.model_spec import ModelSpec

from .hardware import Hardware

RESERVE = 0.10  # of HBM: allocator fragmentation, NCCL buffers, workspaces (suggested default)

# Model-state bytes per parameter per device as a function of the DP degree d (cost-model.md §2.2).
OPTIMIZERS: dict[str, Callable[[int], float]] = {
    "distopt-fp32": lambda d: 6.0 + 12.0 / d,  # distributed optimizer, fp32 grads (default)
    "distopt": lambda d: 4.0 + 12.0 / d,  # ZeRO-1 with bf16 grads
    "zero2": lambda d: 2.0 + 14.0 / d,
    "zero3": lambda d: 16.0 / d,
    "adam": lambda d: 16.0,  # plain mixed-precision Adam, bf16 grads
    "adam-fp32": lambda d: 18.0,  # plain, fp32 grads
}
GRAD_BYTES = {"distopt-fp32": 4, "adam-fp32": 4}  # bytes per gradient element on the wire; else bf16


def bytes_per_param(optimizer: str, dp: int) -> float:
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"cost.optimizer = {optimizer!r}: unknown; allowed: {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[optimizer](max(dp, 1))


def attn_params_per_layer(model: ModelSpec) -> int:
    """QKV (+ bias) and output projection of one layer."""
    h, kv = model.hidden, model.kv_heads * model.head_dim
    return h * (h + 2 * kv) + (h + 2 * kv if model.qkv_bias else 0) + h * h


def mlp_params_per_layer(model: ModelSpec) -> int:
    return 3 * model.hidden * model.ffn


def device_params(
    model: ModelSpec,
    num_layers: int,
    first: bool,
    last: bool,
    tp: int,
    head_share: float | None = None,
    ffn_share: float | None = None,
) -> float:
    """Parameters held by one TP rank whose head and FFN shares are given (default 1/tp)."""
    hs = 1.0 / tp if head_share is None else head_share
    fs = 1.0 / tp if ffn_share is None else ffn_share
    h = model.hidden
    per_layer = attn_params_per_layer(model) * hs + mlp_params_per_layer(model) * fs + 2 * h
    vocab = model.vocab * h / tp
    return num_layers * per_layer + (vocab if first else 0.0) + (vocab + h if last else 0.0)


def shard_params(
    model: ModelSpec,
    num_layers: int,
    embedding: bool,
    head: bool,
    tp_split: tuple[int, ...],
    ffn_split: tuple[int, ...],
    rank: int,
    vocab_parallel: bool = True,
) -> float:
    """Parameters (= gradient elements) TP rank `rank` holds of `num_layers` layers, plus the
    embedding (`embedding`) and the final norm + LM head (`head`), exactly as the shards lie.

    Rank r holds a contiguous range of query heads, the kv heads those read (a kv head whose query
    group straddles two ranks is held by both), its FFN columns and full norm weights. Embedding
    and LM head are split evenly over the group when `vocab_parallel` (Megatron), else held whole
    by every rank (this repository's runtime, `resihp.model.sharding`). The unsharded layout is
    the one-rank split `((heads,), (ffn,), 0)`. Equals `device_params` for splits that cut kv
    groups evenly (every uniform plan).
    """
    h, hd = model.hidden, model.head_dim
    q0 = sum(tp_split[:rank])
    q1 = q0 + tp_split[rank]
    group = model.heads // model.kv_heads
    q, kv = q1 - q0, (q1 - 1) // group + 1 - q0 // group
    attn = 2 * q * hd * h + 2 * kv * hd * h + ((q + 2 * kv) * hd if model.qkv_bias else 0)
    per_layer = attn + 3 * h * ffn_split[rank] + 2 * h
    vocab = model.vocab * h / (len(tp_split) if vocab_parallel else 1)
    return num_layers * per_layer + (vocab if embedding else 0.0) + (vocab + h if head else 0.0)


@lru_cache(maxsize=4096, typed=True)
def device_bytes(
    model: ModelSpec,
    tp_split: tuple[int, ...],
    ffn_split: tuple[int, ...],
    parts,
    tokens: float,
    optimizer: str = "distopt-fp32",
    sequence_parallel: bool = True,
    vocab_parallel: bool = True,
) -> tuple[tuple[float, float], ...]:
    """Per TP rank of a stage: (static bytes, activation bytes per live micro-batch).

    `parts`: the stage's gradient segments as (num_layers, embedding, head, holders) tuples; each
    part's model state costs `bytes_per_param(optimizer, holders)` per parameter (a distributed
    optimizer shards it over the groups holding those layers). Static bytes add one micro-batch's
    fp32 logits on the last stage (the part with the head). This is the one memory formula of the
    simulator (`build_costs`) and of the scheduler's memory check (`sched.model`), memoised (a
    pure function of its arguments, asked again for every plan of a replan).
    """
    tp = len(tp_split)
    last = any(head for _, _, head, _ in parts)
    num_layers = sum(n for n, _, _, _ in parts)
    logits = logits_bytes(model, tokens, tp) if last else 0.0
    out = []
    for r in range(tp):
        static = sum(
            shard_params(model, n, emb, head, tp_split, ffn_split, r, vocab_parallel)
            * bytes_per_param(optimizer, k)
            for n, emb, head, k in parts
        )
        hs, fs = tp_split[r] / model.heads, ffn_split[r] / model.ffn
        act = num_layers * tokens * activation_bytes_per_token(model, tp, hs, fs, sequence_parallel)
        out.append((static + logits, act))
    return tuple(out)


def activation_bytes_per_token(
    model: ModelSpec,
    tp: int,
    head_share: float | None = None,
    ffn_share: float | None = None,
    sequence_parallel: bool = True,
) -> float:
    """A_tok: bytes per token per layer kept for the backward by one TP rank."""
    hs = 1.0 / tp if head_share is None else head_share
    fs = 1.0 / tp if ffn_share is None else ffn_share
    h, kv = model.hidden, model.kv_heads * model.head_dim
    replicated = 8.0 * h / tp if sequence_parallel else 8.0 * h
    return replicated + 2.0 * (2 * h + 2 * kv) * hs + 2.0 * 3 * model.ffn * fs


def logits_bytes(model: ModelSpec, tokens: float, tp: int) -> float:
    """fp32 logits of one micro-batch on one rank of the last stage (vocabulary-parallel)."""
    return 4.0 * tokens * model.vocab / tp


@dataclass(frozen=True)
class StageMemory:
    """Bytes on the most loaded device of a stage."""

    static: float  # parameters, gradients, optimizer state
    act_per_mb: float  # activations of one live micro-batch
    logits: float  # transient fp32 logits (last stage)
    n_live: int

    @property
    def total(self) -> float:
        return self.static + self.n_live * self.act_per_mb + self.logits


def stage_memory(
    model: ModelSpec,
    num_layers: int,
    first: bool,
    last: bool,
    tp: int,
    tokens: float,
    n_live: int,
    dp: int = 1,
    optimizer: str = "distopt-fp32",
    sequence_parallel: bool = True,
) -> StageMemory:
    """Memory of one rank of an evenly split stage holding `n_live` micro-batches of `tokens` tokens."""
    static = device_params(model, num_layers, first, last, tp) * bytes_per_param(optimizer, dp)
    act = num_layers * tokens * activation_bytes_per_token(model, tp, sequence_parallel=sequence_parallel)
    return StageMemory(static, act, logits_bytes(model, tokens, tp) if last else 0.0, n_live)


def usable_bytes(hardware: Hardware, reserve: float = RESERVE) -> float:
    return (1.0 - reserve) * hardware.hbm_bytes


def fits(total_bytes: float, hardware: Hardware, reserve: float = RESERVE) -> bool:
    """The feasibility check of cost-model.md §2.5."""
    return total_bytes <= usable_bytes(hardware, reserve)


def k_min(
    model: ModelSpec,
    num_layers: int,
    first: bool,
    last: bool,
    tokens: float,
    n_live: int,
    hardware: Hardware,
    dp: int = 1,
    max_tp: int | None = None,
    **options,
) -> int | None:
    """Smallest power-of-two TP degree at which the stage fits (ResiHP eq. 3); None if none does.

    Degrees go up to `max_tp` (default: the model's KV-head count, beyond which KV heads would need
    replication; at least 1).
    """
    limit = max_tp if max_tp is not None else model.kv_heads
    t = 1
    while t <= min(limit, model.heads):
        if model.heads % t == 0:
            mem = stage_memory(model, num_layers, first, last, t, tokens, n_live, dp, **options)
            if fits(mem.total, hardware):
                return t
        t *= 2
    return None
