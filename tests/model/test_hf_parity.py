import pytest
import torch

from resihp.core.model_spec import ModelSpec, model_preset
from resihp.model import build_stage, init_state

BIAS_GQA = ModelSpec("bias-gqa", 2, 64, 8, 2, 96, 256, qkv_bias=True)
transformers = pytest.importorskip("transformers")


def _hf_model(spec, state):
    cfg = transformers.LlamaConfig(
        vocab_size=spec.vocab,
        hidden_size=spec.hidden,
        intermediate_size=spec.ffn,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        head_dim=spec.head_dim,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        max_position_embeddings=512,
        tie_word_embeddings=False,
        attention_bias=spec.qkv_bias,
        mlp_bias=False,
    )
    model = transformers.LlamaForCausalLM(cfg).eval()
    sd = {
        "model.embed_tokens.weight": state["embed.weight"],
        "model.norm.weight": state["norm.weight"],
        "lm_head.weight": state["lm_head.weight"],
    }
    ours = {"input_layernorm": "attn_norm", "post_attention_layernorm": "mlp_norm"}
    proj = {"q_proj": "wq", "k_proj": "wk", "v_proj": "wv", "o_proj": "wo"}
    mlp = {"gate_proj": "w_gate", "up_proj": "w_up", "down_proj": "w_down"}
    for k in range(spec.num_layers):
        hf, me = f"model.layers.{k}", f"layers.{k}"
        for a, b in ours.items():
            sd[f"{hf}.{a}.weight"] = state[f"{me}.{b}.weight"]
        for a, b in proj.items():
            sd[f"{hf}.self_attn.{a}.weight"] = state[f"{me}.attn.{b}"]
            if spec.qkv_bias:
                bias = state.get(f"{me}.attn.b{b[1]}")
                sd[f"{hf}.self_attn.{a}.bias"] = bias if a != "o_proj" else torch.zeros(spec.hidden)
        for a, b in mlp.items():
            sd[f"{hf}.mlp.{a}.weight"] = state[f"{me}.mlp.{b}"]
    model.load_state_dict(sd, strict=True)
    return model


SPECS = [model_preset("tiny"), model_preset("tiny-gqa"), BIAS_GQA]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_logits_match_hf_llama(spec, perturbed):
    """Our full model and transformers' LlamaForCausalLM with the same weights give the same logits."""
    state = perturbed(init_state(spec, seed=3))
    ours = build_stage(spec, state=state)
    hf = _hf_model(spec, state)
    ids = torch.randint(0, spec.vocab, (48,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = ours(ids, torch.zeros_like(ids), torch.arange(48))  # (N, V)
        want = hf(ids[None]).logits[0]  # (N, V)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
