"""One decoder layer, possibly a TP shard of it: RMSNorm, RoPE attention over packed segments, SwiGLU.

Tensor-parallel semantics are Megatron's with the collectives injected from outside, so this
module never touches `torch.distributed`. A layer shard computes

    x = x + reduce(attention_shard(rms_norm(enter(x))))
    x = x + reduce(mlp_shard(rms_norm(enter(x))))

where a shard's attention output projection and MLP down projection produce *partial sums* over
the hidden dimension. For a TP group the runtime passes
  * `reduce`: all-reduce (sum) in forward, identity in backward (Megatron's `g`);
  * `enter`:  identity in forward, all-reduce (sum) of the gradient in backward (Megatron's `f`).
Both default to identity, which is exact for an unsharded layer. Because `enter` sits before the
norm, each rank's norm-weight and replicated-kv gradients are partial; `sharding.sync_tp_grads`
completes them.

A micro-batch is one packed window of N tokens (no batch dimension). Attention is causal and only
within a segment (a document piece); RoPE positions restart at 0 at every segment start. The
packer keeps every segment contiguous, so the window's attention is one causal attention per
document (`attention.py`): its cost grows with the sum of the squared document lengths, as the
cost model says (`c0 + a·N + b·Σl²`), instead of with N² as a dense masked attention's would.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from resihp.core.model_spec import ModelSpec, RopeScaling

from .attention import Docs, attention
from .sharding import ffn_range, head_range, kv_range

ROPE_THETA = 10000.0  # the defaults of ModelSpec (rope_theta, rms_norm_eps)
RMS_EPS = 1e-5


def identity(x: torch.Tensor) -> torch.Tensor:
    return x


class Weight(nn.Module):
    """Holder of one parameter called `weight` (uninitialised; `load_state_dict` fills it)."""

    def __init__(self, *shape: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(shape))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = RMS_EPS) -> torch.Tensor:
    var = x.pow(2).mean(-1, keepdim=True)  # (N, 1)
    return weight * (x * torch.rsqrt(var + eps))  # (N, h)


def rope_inv_freq(
    head_dim: int, theta: float = ROPE_THETA, scaling: RopeScaling | None = None
) -> torch.Tensor:
    """RoPE's (head_dim/2,) inverse frequencies theta^(-2i/d), with Llama 3.1's scaling when given.

    Computed with the same fp32 operations, in the same order, as `transformers`'
    `_compute_default_rope_parameters` / `_compute_llama3_parameters`, so that imported models give
    its logits to the last bits: a long-wavelength band divided by `factor`, a short one kept, the
    band between blended by `smooth = (L_orig / wavelen - low) / (high - low)`.
    """
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim  # (hd/2,)
    inv_freq = 1.0 / (theta**exponent)  # (hd/2,)
    if scaling is None:
        return inv_freq
    factor, low, high = scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor
    old = scaling.original_max_position_embeddings
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * math.pi / inv_freq  # (hd/2,)
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)  # (hd/2,)
    smooth = (old / wavelen - low) / (high - low)  # (hd/2,)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled  # (hd/2,)
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)  # (hd/2,) bool
    return torch.where(medium, smoothed, scaled)  # (hd/2,)


def rope_tables(
    positions: torch.Tensor, head_dim: int, theta: float = ROPE_THETA, scaling: RopeScaling | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables (N, head_dim) for the half-split (`rotate_half`) RoPE convention."""
    inv_freq = rope_inv_freq(head_dim, theta, scaling).to(positions.device)  # (hd/2,)
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # (N, hd/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (N, hd)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)  # (H, N, hd)
    return x * cos + rotated * sin  # (H, N, hd)


def segment_mask(segment_ids: torch.Tensor) -> torch.Tensor:
    """Boolean (N, N) mask, True where query i may attend key j: same segment and j <= i. Only the
    tests' oracle uses it (`attention` with a mask is the dense path)."""
    same = segment_ids[:, None] == segment_ids[None, :]  # (N, N)
    n = segment_ids.shape[0]
    causal = torch.ones(n, n, dtype=torch.bool, device=segment_ids.device).tril()  # (N, N)
    return same & causal


class Attention(nn.Module):
    """Query heads [q0, q1) and the kv heads [k0, k1) they read; output is a partial sum over heads."""

    def __init__(self, spec: ModelSpec, tp_split, rank: int) -> None:
        super().__init__()
        h, hd = spec.hidden, spec.head_dim
        q0, q1 = head_range(tp_split, rank)
        k0, k1 = kv_range(spec, tp_split, rank)
        self.head_dim = hd
        self.num_q, self.num_kv = q1 - q0, k1 - k0
        self.wq = nn.Parameter(torch.empty(self.num_q * hd, h))
        self.wk = nn.Parameter(torch.empty(self.num_kv * hd, h))
        self.wv = nn.Parameter(torch.empty(self.num_kv * hd, h))
        self.wo = nn.Parameter(torch.empty(h, self.num_q * hd))
        if spec.qkv_bias:
            self.bq = nn.Parameter(torch.empty(self.num_q * hd))
            self.bk = nn.Parameter(torch.empty(self.num_kv * hd))
            self.bv = nn.Parameter(torch.empty(self.num_kv * hd))
        else:
            self.bq = self.bk = self.bv = None
        group = spec.heads // spec.kv_heads
        # local kv head read by each local query head
        kv_of_q = torch.tensor([(q0 + i) // group - k0 for i in range(self.num_q)], dtype=torch.long)
        self.register_buffer("kv_of_q", kv_of_q, persistent=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, docs: Docs | torch.Tensor):
        n, hd = x.shape[0], self.head_dim
        q = F.linear(x, self.wq, self.bq).view(n, self.num_q, hd).transpose(0, 1)  # (Hq, N, hd)
        k = F.linear(x, self.wk, self.bk).view(n, self.num_kv, hd).transpose(0, 1)  # (Hkv, N, hd)
        v = F.linear(x, self.wv, self.bv).view(n, self.num_kv, hd).transpose(0, 1)  # (Hkv, N, hd)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k = k.index_select(0, self.kv_of_q)  # (Hq, N, hd)
        v = v.index_select(0, self.kv_of_q)  # (Hq, N, hd)
        out = attention(q, k, v, docs)  # (Hq, N, hd)
        out = out.transpose(0, 1).reshape(n, self.num_q * hd)  # (N, Hq*hd)
        return F.linear(out, self.wo)  # (N, h) partial sum over this shard's heads


class MLP(nn.Module):
    """SwiGLU over FFN columns [f0, f1); output is a partial sum over columns."""

    def __init__(self, spec: ModelSpec, ffn_split, rank: int) -> None:
        super().__init__()
        f0, f1 = ffn_range(ffn_split, rank)
        self.w_gate = nn.Parameter(torch.empty(f1 - f0, spec.hidden))
        self.w_up = nn.Parameter(torch.empty(f1 - f0, spec.hidden))
        self.w_down = nn.Parameter(torch.empty(spec.hidden, f1 - f0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = F.silu(F.linear(x, self.w_gate)) * F.linear(x, self.w_up)  # (N, f)
        return F.linear(hidden, self.w_down)  # (N, h) partial sum over this shard's columns


class DecoderLayer(nn.Module):
    """Pre-norm decoder layer shard `rank` of (tp_split, ffn_split); see the module doc for TP."""

    def __init__(self, spec: ModelSpec, tp_split, ffn_split, rank: int) -> None:
        super().__init__()
        self.eps = spec.rms_norm_eps
        self.attn_norm = Weight(spec.hidden)
        self.attn = Attention(spec, tp_split, rank)
        self.mlp_norm = Weight(spec.hidden)
        self.mlp = MLP(spec, ffn_split, rank)

    def attn_branch(self, x, cos, sin, docs) -> torch.Tensor:
        return self.attn(rms_norm(x, self.attn_norm.weight, self.eps), cos, sin, docs)  # (N, h) partial

    def mlp_branch(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(rms_norm(x, self.mlp_norm.weight, self.eps))  # (N, h) partial

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        docs: Docs | torch.Tensor,
        enter: Callable[[torch.Tensor], torch.Tensor] = identity,
        reduce: Callable[[torch.Tensor], torch.Tensor] = identity,
    ) -> torch.Tensor:
        x = x + reduce(self.attn_branch(enter(x), cos, sin, docs))  # (N, h)
        return x + reduce(self.mlp_branch(enter(x)))  # (N, h)
