"""Test helpers: tiny random Hugging Face models built with `transformers` itself (no downloads),
and an in-process TP forward of stage shards (the sum a TP all-reduce makes, rank by rank).

Imported by module name (each test inserts `tests/` into `sys.path`).
"""

from __future__ import annotations

import torch

SEQ_LEN = 64
KINDS = ("llama", "qwen2", "mistral")


def hf_config(kind: str, **overrides):
    """A tiny config of `kind` exercising what the importer reads: Llama with GQA, a large RoPE base
    and Llama 3.1 scaling (head_dim 8: wavelengths 6, 167, 4443, 118000 fall in the kept, the
    blended and the stretched band); Qwen2 with q/k/v bias and tied
    embeddings; Mistral with a sliding window exactly `SEQ_LEN` (no effect on our windows)."""
    import transformers

    common = dict(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
    )
    if kind == "llama":
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 512}  # fmt: skip
        common["max_position_embeddings"] = 1024
        cfg = transformers.LlamaConfig(**common, rope_parameters=rope, tie_word_embeddings=False)
    elif kind == "qwen2":
        rope = {"rope_type": "default", "rope_theta": 1000000.0}
        cfg = transformers.Qwen2Config(**common, rope_parameters=rope, tie_word_embeddings=True)
    else:
        cfg = transformers.MistralConfig(**common, sliding_window=SEQ_LEN, tie_word_embeddings=False)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cfg


def make_hf_model(kind: str, directory, seed: int = 0, **overrides):
    """A random model of `kind` (norms and biases moved off 1 / 0) saved to `directory`; returns it."""
    import transformers

    cls = {
        "llama": transformers.LlamaForCausalLM,
        "qwen2": transformers.Qwen2ForCausalLM,
        "mistral": transformers.MistralForCausalLM,
    }[kind]
    torch.manual_seed(seed)
    model = cls(hf_config(kind, **overrides)).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                base = 1.0 if name.endswith("norm.weight") else 0.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    model.save_pretrained(str(directory))
    return model


def load_hf(directory):
    """transformers' own load of a model directory: (model, loading info), fp32, eval mode."""
    import transformers

    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        str(directory), output_loading_info=True, dtype=torch.float32
    )
    return model.eval(), info


def tp_stage_forward(shards, x, segment_ids, positions):
    """A stage's TP shards (one StageModel per rank) run as one TP group: every branch's partial
    outputs summed over the ranks (the all-reduce's result); embedding and head from rank 0."""
    from resihp.model import rms_norm, rope_tables, segment_mask

    first = shards[0]
    spec = first.spec
    if first.is_first:
        x = first.embed.weight[x]  # (N, h)
    cos, sin = rope_tables(positions, spec.head_dim, spec.rope_theta, spec.rope_scaling)
    mask = segment_mask(segment_ids)
    for k in first.layers:
        layers = [s.layers[k] for s in shards]
        x = x + sum(layer.attn_branch(x, cos, sin, mask) for layer in layers)  # (N, h)
        x = x + sum(layer.mlp_branch(x) for layer in layers)  # (N, h)
    if first.is_last:
        x = rms_norm(x, first.norm.weight, spec.rms_norm_eps) @ first.lm_head.weight.t()  # (N, V)
    return x
