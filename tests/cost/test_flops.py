"""FLOPs of LLaMA layers against the published closed forms (cost-model.md §1)."""

import pytest

from resihp.core import model_preset
from resihp.cost import flops

L7 = model_preset("llama2-7b")


def test_llama2_7b_training_flops_per_token_match_6n_plus_attention():
    """LLaMA 2-7B training FLOPs per token at 4K are within 3% of 6·params + 12·L·h·S (c_att = 1)."""
    ours = flops.training_flops_per_token(L7, 4096)
    ref = flops.reference_flops_per_token(L7, 4096)
    assert ours == pytest.approx(ref, rel=0.03)
    # The remaining gap is exactly the input embedding, which has no matmul FLOPs.
    assert ours == pytest.approx(ref - 6 * (L7.embedding_params + 2 * L7.hidden * L7.num_layers + L7.hidden))


def test_backward_split_sums_to_twice_the_forward():
    """B + W = 2·F for any packing, and B/W = 1 + 2·F_att/F_lin."""
    n, sq = 8192.0, 3 * 2048.0**2
    f, b, w = (flops.chunk_flops(L7, 4, n, sq, k, last=True) for k in (flops.F, flops.B, flops.W))
    assert b + w == pytest.approx(2 * f)
    lin = flops.linear_flops_per_token(L7) * n
    att = flops.attn_core_flops_per_sq(L7) * sq
    assert flops.chunk_flops(L7, 1, n, sq, flops.B) / flops.chunk_flops(
        L7, 1, n, sq, flops.W
    ) == pytest.approx(1 + 2 * att / lin)


def test_mha_two_matrix_ffn_reduces_to_megatron():
    """With n_kv = a the per-layer forward is Megatron's 24·T·h² + 4·T·S·h plus the SwiGLU third matrix."""
    h, s = L7.hidden, 4096
    ours = flops.layer_forward_flops(L7, s, s * s, c_att=1.0)
    megatron_attn = 8 * s * h * h + 4 * s * s * h  # QKV + O projections and QKᵀ, P·V
    assert ours == pytest.approx(megatron_attn + 6 * s * h * L7.ffn)
