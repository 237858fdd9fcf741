import pytest
import torch

from resihp.core.model_spec import ModelSpec, model_preset
from resihp.model import build_stage, init_state

BIAS_GQA = ModelSpec("bias-gqa", 2, 64, 8, 2, 96, 256, qkv_bias=True)
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")


def _hf_model(spec, state):
    """transformers' model of `spec` (Llama; Qwen2 with q/k/v bias) holding `state`, through the
    package's one name mapping (`model.hf.to_hf_state`, `core.hf_config.config_from_spec`)."""
    from resihp.core.hf_config import config_from_spec
    from resihp.model.hf import to_hf_state

    cfg = config_from_spec(spec)
    cls = getattr(transformers, cfg["architectures"][0])
    config = transformers.AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "architectures"})
    model = cls(config).eval()
    model.load_state_dict(to_hf_state(spec, state), strict=True)
    return model


SPECS = [model_preset("tiny"), model_preset("tiny-gqa"), BIAS_GQA]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_logits_match_hf_llama(spec, perturbed):
    """Our full model and transformers' LlamaForCausalLM (Qwen2 for q/k/v bias) with the same
    weights give the same logits."""
    state = perturbed(init_state(spec, seed=3))
    ours = build_stage(spec, state=state)
    hf = _hf_model(spec, state)
    ids = torch.randint(0, spec.vocab, (48,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = ours(ids, torch.zeros_like(ids), torch.arange(48))  # (N, V)
        want = hf(ids[None]).logits[0]  # (N, V)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
