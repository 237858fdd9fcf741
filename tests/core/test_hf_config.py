"""config.json -> ModelSpec: every field the three architectures use is read, anything we do not
compute is refused with one line naming the field (torch-free)."""

import json

import pytest

from resihp.core.hf_config import config_from_spec, hf_name, read_config, spec_from_config, weight_files
from resihp.core.model_spec import ModelSpec, RopeScaling

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 300,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 4096,
}


def _spec(seq_len=128, **changes):
    return spec_from_config({**LLAMA, **changes}, "model.hf d", seq_len)


def test_pre_v5_spelling_rope_theta_and_rope_scaling():
    """The Hub's configs (transformers < 5) put the base in rope_theta and the scaling in rope_scaling."""
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}  # fmt: skip
    spec = _spec(rope_theta=500000.0, rope_scaling=scaling)
    assert spec.rope_theta == 500000.0 and spec.rope_scaling == RopeScaling(8.0, 1.0, 4.0, 8192)
    assert _spec(rope_scaling={"type": "llama3", **{k: v for k, v in scaling.items() if k != "rope_type"}})
    assert _spec().rope_theta == 10000.0 and _spec().rope_scaling is None and _spec().kv_heads == 2
    assert _spec(num_key_value_heads=None).kv_heads == 8  # absent: multi-head attention
    # original_max_position_embeddings falls back to max_position_embeddings, as transformers does
    short = {k: v for k, v in scaling.items() if k != "original_max_position_embeddings"}
    assert _spec(rope_scaling=short).rope_scaling.original_max_position_embeddings == 4096


@pytest.mark.parametrize(
    "changes,field",
    [
        ({"architectures": ["GPT2LMHeadModel"]}, "architectures"),
        ({"head_dim": 16}, "head_dim = 16"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type = 'yarn'"),
        (
            {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}},
            "rope_type = 'linear'",
        ),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
        ({"attention_bias": True}, "attention_bias = True"),
        ({"mlp_bias": True}, "mlp_bias = True"),
        ({"hidden_act": "gelu"}, "hidden_act = 'gelu'"),
        ({"attention_dropout": 0.1}, "attention_dropout = 0.1"),
        ({"pretraining_tp": 2}, "pretraining_tp = 2"),
        ({"quantization_config": {"quant_method": "gptq"}}, "quantization_config"),
        ({"vocab_size": 0}, "vocab_size = 0"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "low_freq_factor"),
        ({"tie_word_embeddings": "yes"}, "tie_word_embeddings"),
    ],
)
def test_unsupported_fields_are_named(changes, field):
    with pytest.raises(ValueError, match="model.hf d") as exc:
        _spec(**changes)
    assert field in str(exc.value) and "\n" not in str(exc.value)


def test_sliding_window_refused_only_where_it_would_cut_attention():
    """Mistral's window applies to every layer, Qwen2's only with use_sliding_window to layers
    >= max_window_layers (or as layer_types says); a window >= seq_len changes nothing."""
    mistral = {**LLAMA, "architectures": ["MistralForCausalLM"], "sliding_window": 4096}
    assert spec_from_config(mistral, "m", seq_len=4096)
    with pytest.raises(ValueError, match=r"sliding_window = 4096 on layers 0\.\.1.*seq_len = 8192"):
        spec_from_config(mistral, "m", seq_len=8192)
    assert spec_from_config({**mistral, "sliding_window": None}, "m", seq_len=8192)
    qwen = {**LLAMA, "architectures": ["Qwen2ForCausalLM"], "sliding_window": 32, "max_window_layers": 1}
    assert spec_from_config(qwen, "q", seq_len=128).qkv_bias  # use_sliding_window absent: off
    with pytest.raises(ValueError, match=r"layers 1\.\.1"):
        spec_from_config({**qwen, "use_sliding_window": True}, "q", seq_len=128)
    types = {**qwen, "layer_types": ["sliding_attention", "full_attention"]}
    with pytest.raises(ValueError, match=r"layers 0\.\.0"):
        spec_from_config(types, "q", seq_len=128)
    assert spec_from_config({**qwen, "layer_types": ["full_attention"] * 2}, "q", seq_len=128)


def test_config_round_trip_keeps_the_spec_and_other_fields():
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}  # fmt: skip
    base = {**LLAMA, "bos_token_id": 7, "rope_parameters": {"rope_theta": 5e5, **scaling}}
    spec = spec_from_config(base, "b", name="x")
    out = config_from_spec(spec, base)
    assert out["bos_token_id"] == 7 and "rope_parameters" not in out
    assert spec_from_config(json.loads(json.dumps(out)), "o", name="x") == spec
    fresh = ModelSpec("q", 2, 64, 8, 2, 96, 256, qkv_bias=True, tie_word_embeddings=True)
    cfg = config_from_spec(fresh)
    assert cfg["architectures"] == ["Qwen2ForCausalLM"] and spec_from_config(cfg, "f", name="q") == fresh


def test_names_and_directory_errors(tmp_path):
    spec = ModelSpec("q", 2, 64, 8, 2, 96, 256, qkv_bias=True, tie_word_embeddings=True)
    assert hf_name(spec, "lm_head.weight") == "model.embed_tokens.weight"
    assert hf_name(spec, "layers.1.attn.bk") == "model.layers.1.self_attn.k_proj.bias"
    assert hf_name(spec, "layers.0.mlp_norm.weight") == "model.layers.0.post_attention_layernorm.weight"
    with pytest.raises(ValueError, match="no such directory"):
        read_config(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="has no config.json"):
        read_config(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a readable JSON"):
        read_config(str(tmp_path))
    assert weight_files(str(tmp_path)) == {}
    (tmp_path / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="pickled .bin"):
        weight_files(str(tmp_path))
