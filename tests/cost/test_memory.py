"""Per-stage memory and the feasibility check (cost-model.md §2.5 worked example)."""

import pytest

from resihp.core import model_preset
from resihp.cost import hardware_preset, k_min, stage_memory
from resihp.cost.memory import activation_bytes_per_token, bytes_per_param, device_params, fits

L13 = model_preset("llama2-13b")
A80 = hardware_preset("a100-80g")


def test_llama2_13b_tp4_stage0_worked_example():
    """LLaMA 2-13B, TP 4, PP 4, S = 16K, d = 2: stage 0 needs about 37 GB and fits 80 GB but not 40 GB."""
    mem = stage_memory(L13, 10, True, False, tp=4, tokens=16384, n_live=4, dp=2)
    assert device_params(L13, 10, True, False, 4) / 1e9 == pytest.approx(0.83, abs=0.01)
    assert mem.static / 1e9 == pytest.approx(10.0, abs=0.05)
    assert mem.act_per_mb / 1e9 == pytest.approx(6.75, abs=0.01)
    assert mem.total / 1e9 == pytest.approx(37.0, abs=0.1)
    assert fits(mem.total, A80) and not fits(mem.total, hardware_preset("a100-40g"))


def test_llama2_13b_tp2_is_infeasible_on_80gb():
    """After an exclusion to TP 2 the same stage needs about 74 GB, over 80 GB minus the 10% reserve."""
    mem = stage_memory(L13, 10, True, False, tp=2, tokens=16384, n_live=4, dp=2)
    assert mem.total / 1e9 == pytest.approx(74.0, abs=0.1)
    assert not fits(mem.total, A80)
    assert k_min(L13, 10, True, False, tokens=16384, n_live=4, hardware=A80, dp=2) == 4


def test_activation_bytes_llama2_7b_tp4_sp():
    """LLaMA 2-7B at TP 4 with sequence parallelism keeps 32,896 bytes per token per layer."""
    assert activation_bytes_per_token(model_preset("llama2-7b"), 4) == pytest.approx(32896)


def test_optimizer_schemes_and_uneven_shares():
    """Bytes per parameter follow the ZeRO table, and a bigger head/FFN share holds more parameters."""
    assert bytes_per_param("distopt-fp32", 2) == 12 and bytes_per_param("zero3", 64) == 0.25
    with pytest.raises(ValueError, match="allowed"):
        bytes_per_param("sgd", 1)
    small = device_params(L13, 10, False, False, 4, head_share=8 / 40, ffn_share=0.2)
    big = device_params(L13, 10, False, False, 4, head_share=12 / 40, ffn_share=0.3)
    assert big > small


def test_last_stage_holds_fp32_logits():
    """The last stage carries 4·T·V/t bytes of fp32 logits; Qwen 2.5 at 8K and TP 4 about 1.25 GB."""
    qwen = model_preset("qwen2.5-7b")
    mem = stage_memory(qwen, 7, False, True, tp=4, tokens=8192, n_live=1)
    assert mem.logits / 1e9 == pytest.approx(1.25, abs=0.01)
