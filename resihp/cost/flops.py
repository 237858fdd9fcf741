"""Matmul FLOPs of LLaMA/Qwen layers on packed micro-batches (cost-model.md §1.2, §1.3).

For a micro-batch of T tokens whose documents have lengths l_i (block-diagonal mask):

    F_lin = 2·T·[h·(h + 2·n_kv·d_h) + h·h + 3·h·F]     QKV, output projection, SwiGLU gate/up/down
    F_att = c_att·4·h·Σ l_i²                             QKᵀ and P·V
    logits (last stage) = 2·T·h·V

Chunks: F = F_lin + F_att; B (input gradient) = F_lin + 2·F_att; W (weight gradient) = F_lin; the
logit layer adds 2·T·h·V to each of F, B and W. So B + W = 2·F. `c_att = 1/2` is what a causal
kernel executes (the time model's default); `c_att = 1` is the Megatron/PaLM convention for
reported MFU. Embedding lookups, norms, rotary and softmax have no matmul FLOPs (see build.py for
their memory-bound per-token time).
"""

from __future__ import annotations

from resihp.core.model_spec import ModelSpec

C_ATT_TIME = 0.5  # executed by a causal kernel that skips masked tiles
C_ATT_REPORT = 1.0  # Megatron / PaLM convention for MFU
F, B, W = 0, 1, 2
# Multipliers of (linear, attention core, logits) FLOPs per chunk kind F, B, W (cost-model.md §1.3).
KIND_FACTORS = ((1.0, 1.0, 1.0), (1.0, 2.0, 1.0), (1.0, 0.0, 1.0))


def attn_proj_flops_per_token(model: ModelSpec) -> float:
    """QKV and output projections of one layer, per token (scales with a device's head share)."""
    h, kv = model.hidden, model.kv_heads * model.head_dim
    return 2.0 * (h * (h + 2 * kv) + h * h)


def mlp_flops_per_token(model: ModelSpec) -> float:
    """SwiGLU gate, up and down projections of one layer, per token (scales with the FFN share)."""
    return 2.0 * 3 * model.hidden * model.ffn


def linear_flops_per_token(model: ModelSpec) -> float:
    """F_lin / T of one layer."""
    return attn_proj_flops_per_token(model) + mlp_flops_per_token(model)


def attn_core_flops_per_sq(model: ModelSpec, c_att: float = C_ATT_TIME) -> float:
    """F_att / Σl² of one layer."""
    return c_att * 4.0 * model.hidden


def logits_flops_per_token(model: ModelSpec) -> float:
    """LM-head matmul per token (last stage), once in each of F, B and W."""
    return 2.0 * model.hidden * model.vocab


def layer_forward_flops(model: ModelSpec, tokens: float, sum_sq: float, c_att: float = C_ATT_TIME) -> float:
    """F_lin + F_att of one layer for a micro-batch of `tokens` tokens with Σl² = `sum_sq`."""
    return linear_flops_per_token(model) * tokens + attn_core_flops_per_sq(model, c_att) * sum_sq


def chunk_flops(
    model: ModelSpec,
    num_layers: int,
    tokens: float,
    sum_sq: float,
    kind: int,
    last: bool = False,
    c_att: float = C_ATT_TIME,
) -> float:
    """Whole-stage (all TP ranks together) FLOPs of one F, B or W chunk of a micro-batch."""
    lin, att, logit = KIND_FACTORS[kind]
    per_layer = (
        lin * linear_flops_per_token(model) * tokens + att * attn_core_flops_per_sq(model, c_att) * sum_sq
    )
    return num_layers * per_layer + (logit * logits_flops_per_token(model) * tokens if last else 0.0)


def training_flops_per_token(
    model: ModelSpec, seq_len: int, sum_sq: float | None = None, c_att: float = C_ATT_REPORT
) -> float:
    """F + B + W over the whole model per token, for sequences of `seq_len` tokens.

    `sum_sq` defaults to an unpacked sequence (Σl² = seq_len²).
    """
    sq = float(seq_len) ** 2 if sum_sq is None else float(sum_sq)
    total = sum(
        chunk_flops(model, model.num_layers, seq_len, sq, k, last=True, c_att=c_att) for k in (F, B, W)
    )
    return total / seq_len


def reference_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """The standard estimate 6·params + 12·L·h·S (PaLM App. B / Megatron, whole score matrix)."""
    return 6.0 * model.total_params + 12.0 * model.num_layers * model.hidden * seq_len
