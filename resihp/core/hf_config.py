"""A Hugging Face `config.json` as a ModelSpec, and back (torch-free: the config loader uses it).

Supported: `LlamaForCausalLM`, `Qwen2ForCausalLM`, `MistralForCausalLM` — one decoder (RMSNorm,
RoPE in the `rotate_half` convention, GQA, SwiGLU) that differs only in the fields ModelSpec
carries: Qwen2 has q/k/v biases, any of them may tie the LM head to the embedding, and RoPE may
use another base or Llama 3.1's frequency scaling. Every field of config.json that changes what
the network computes is read here; one we do not implement (another architecture, an `o_proj`
or MLP bias, another activation, dropout, a head_dim other than hidden / heads, another RoPE
scaling, a sliding window that would cut attention at this run's `seq_len`, quantized weights)
raises ValueError naming the field, the value and what is allowed — never a silent difference.

Both config spellings are read: transformers >= 5 writes `rope_parameters`, older ones
`rope_theta` + `rope_scaling` (the Hub's files); export writes the older one, which every
version reads.
"""

from __future__ import annotations

import json
import math
import os
import struct

from .model_spec import ModelSpec, RopeScaling

ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "MistralForCausalLM": "mistral"}
CONFIG = "config.json"
WEIGHTS_INDEX = "model.safetensors.index.json"
ROPE_TYPES = ("default", "llama3")
DEFAULT_RMS_EPS = 1e-6  # transformers' default for all three architectures
DEFAULT_ROPE_THETA = 10000.0


def read_config(directory: str, what: str = "model.hf") -> dict:
    """The parsed `directory/config.json`; ValueError (naming `what`) when missing or not JSON."""
    if not os.path.isdir(directory):
        raise ValueError(f"{what} = {directory!r}: no such directory (a local Hugging Face model directory)")
    path = os.path.join(directory, CONFIG)
    if not os.path.isfile(path):
        raise ValueError(f"{what} = {directory!r}: has no {CONFIG}")
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{what} {path}: not a readable JSON file: {exc}") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{what} {path}: must hold a JSON object")
    return cfg


def architecture(cfg: dict, where: str) -> str:
    """The supported class name config.json asks for."""
    archs = cfg.get("architectures")
    if archs is None:  # some files name only the model type
        by_type = {v: k for k, v in ARCHITECTURES.items()}
        if cfg.get("model_type") in by_type:
            return by_type[cfg["model_type"]]
        raise ValueError(f"{where}: model_type = {cfg.get('model_type')!r}: allowed: {', '.join(by_type)}")
    if not isinstance(archs, list) or len(archs) != 1 or archs[0] not in ARCHITECTURES:
        raise ValueError(
            f"{where}: architectures = {archs!r}: unsupported; allowed: {', '.join(ARCHITECTURES)}"
        )
    return archs[0]


def _int(cfg: dict, key: str, where: str, default=None) -> int:
    v = cfg.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError(f"{where}: {key} = {v!r}: must be a positive integer")
    return v


def _number(cfg: dict, key: str, where: str, default: float) -> float:
    v = cfg.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < math.inf:
        raise ValueError(f"{where}: {key} = {v!r}: must be a number > 0")
    return float(v)


def _require(cfg: dict, key: str, allowed, where: str, why: str) -> None:
    """ValueError unless cfg[key] (absent counts as the default) is one of `allowed`."""
    v = cfg.get(key, allowed[0])
    if v not in allowed:
        raise ValueError(f"{where}: {key} = {v!r}: unsupported ({why}); allowed: {allowed[0]!r}")


def _rope(cfg: dict, where: str) -> tuple[float, RopeScaling | None]:
    """(rope_theta, scaling) from `rope_parameters` (transformers >= 5) or `rope_theta` + `rope_scaling`."""
    params = cfg.get("rope_parameters")
    key = "rope_parameters"
    if params is None:
        params, key = cfg.get("rope_scaling") or {}, "rope_scaling"
    if not isinstance(params, dict):
        raise ValueError(f"{where}: {key} = {params!r}: must be an object")
    if params and all(isinstance(v, dict) for v in params.values()):
        raise ValueError(f"{where}: {key}: RoPE parameters per layer type are unsupported; give one set")
    theta = _number(params, "rope_theta", f"{where}: {key}", cfg.get("rope_theta", DEFAULT_ROPE_THETA))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise ValueError(
            f"{where}: {key}.rope_type = {kind!r}: unsupported; allowed: {', '.join(ROPE_TYPES)}"
        )
    factor = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    if factor != 1.0:
        raise ValueError(f"{where}: partial_rotary_factor = {factor!r}: unsupported; allowed: 1.0")
    if kind == "default":
        return theta, None
    sub = f"{where}: {key}"
    original = params.get("original_max_position_embeddings", cfg.get("max_position_embeddings"))
    try:
        scaling = RopeScaling(
            _number(params, "factor", sub, math.nan),
            _number(params, "low_freq_factor", sub, math.nan),
            _number(params, "high_freq_factor", sub, math.nan),
            original,
        )
    except ValueError as exc:
        raise ValueError(f"{sub}: {exc}") from None
    return theta, scaling


def sliding_layers(cfg: dict, arch: str, num_layers: int) -> list[int]:
    """Layers whose attention transformers restricts to the last `sliding_window` tokens."""
    if cfg.get("sliding_window") is None:
        return []
    types = cfg.get("layer_types")
    if types is not None:
        return [k for k, t in enumerate(types) if t == "sliding_attention"]
    if arch == "MistralForCausalLM":
        return list(range(num_layers))
    if arch == "Qwen2ForCausalLM" and cfg.get("use_sliding_window", False):
        return list(range(cfg.get("max_window_layers", 0), num_layers))
    return []


def spec_from_config(cfg: dict, where: str, seq_len: int | None = None, name: str = "hf") -> ModelSpec:
    """The ModelSpec of a supported config.json; `seq_len` (tokens per packed micro-batch, hence
    the longest attention span): a sliding window shorter than that is refused."""
    arch = architecture(cfg, where)
    hidden, heads = _int(cfg, "hidden_size", where), _int(cfg, "num_attention_heads", where)
    layers = _int(cfg, "num_hidden_layers", where)
    kv = _int({"num_key_value_heads": cfg.get("num_key_value_heads") or heads}, "num_key_value_heads", where)
    ffn, vocab = _int(cfg, "intermediate_size", where), _int(cfg, "vocab_size", where)
    if hidden % heads:
        raise ValueError(
            f"{where}: hidden_size = {hidden}: must be divisible by num_attention_heads = {heads}"
        )
    head_dim = cfg.get("head_dim")
    if head_dim is not None and head_dim != hidden // heads:
        raise ValueError(
            f"{where}: head_dim = {head_dim!r}: unsupported; allowed: hidden_size / num_attention_heads = "
            f"{hidden // heads}"
        )
    if (hidden // heads) % 2:
        raise ValueError(f"{where}: head dimension {hidden // heads}: RoPE needs an even one")
    _require(cfg, "hidden_act", ["silu"], where, "the MLP is SwiGLU")
    _require(cfg, "attention_dropout", [0.0, 0], where, "no dropout")
    _require(cfg, "pretraining_tp", [1], where, "no sliced projections")
    if cfg.get("quantization_config") is not None:
        raise ValueError(
            f"{where}: quantization_config: quantized weights are unsupported; give fp32/bf16/fp16"
        )
    if arch == "LlamaForCausalLM":
        _require(cfg, "attention_bias", [False], where, "a bias on o_proj")
        _require(cfg, "mlp_bias", [False], where, "biases in the MLP")
    tie = cfg.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise ValueError(f"{where}: tie_word_embeddings = {tie!r}: must be true or false")
    window = cfg.get("sliding_window")
    sliding = sliding_layers(cfg, arch, layers)
    if sliding and seq_len is not None and window < seq_len:
        raise ValueError(
            f"{where}: sliding_window = {window!r} on layers {sliding[0]}..{sliding[-1]}: unsupported; "
            f"it would cut attention inside a packed micro-batch of parallel.seq_len = {seq_len} "
            "tokens (allowed: a window >= seq_len, where it has no effect)"
        )
    theta, scaling = _rope(cfg, where)
    eps = _number(cfg, "rms_norm_eps", where, DEFAULT_RMS_EPS)
    return ModelSpec(
        name, layers, hidden, heads, kv, ffn, vocab,
        qkv_bias=arch == "Qwen2ForCausalLM", rope_theta=theta, rope_scaling=scaling,
        rms_norm_eps=eps, tie_word_embeddings=tie,
    )  # fmt: skip


def config_from_spec(spec: ModelSpec, base: dict | None = None) -> dict:
    """A config.json for `spec`: `base` (the imported model's own, so its other fields — token
    ids, context length — survive) with the computing fields set from `spec`, or a fresh one:
    Qwen2ForCausalLM when the spec has q/k/v biases, LlamaForCausalLM otherwise."""
    if base is not None:
        cfg = {
            k: v
            for k, v in base.items()
            if k not in ("torch_dtype", "rope_parameters", "transformers_version")
        }
        arch = architecture(base, "config")
    else:
        arch = "Qwen2ForCausalLM" if spec.qkv_bias else "LlamaForCausalLM"
        cfg = {"max_position_embeddings": 4096, "hidden_act": "silu", "attention_dropout": 0.0}
        if arch == "LlamaForCausalLM":
            cfg.update(attention_bias=False, mlp_bias=False)
    assert spec.qkv_bias == (arch == "Qwen2ForCausalLM"), (spec.name, arch)
    rope = None
    if spec.rope_scaling is not None:
        s = spec.rope_scaling
        rope = {
            "rope_type": "llama3",
            "factor": s.factor,
            "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_position_embeddings,
        }
    cfg.update(
        architectures=[arch],
        model_type=ARCHITECTURES[arch],
        hidden_size=spec.hidden,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        head_dim=spec.head_dim,
        intermediate_size=spec.ffn,
        vocab_size=spec.vocab,
        rms_norm_eps=spec.rms_norm_eps,
        rope_theta=spec.rope_theta,
        rope_scaling=rope,
        tie_word_embeddings=spec.tie_word_embeddings,
        dtype="float32",
    )
    return cfg


# canonical layer suffix (`model.sharding`) -> its name under `model.layers.{k}.` in transformers
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn.wq": "self_attn.q_proj.weight",
    "attn.bq": "self_attn.q_proj.bias",
    "attn.wk": "self_attn.k_proj.weight",
    "attn.bk": "self_attn.k_proj.bias",
    "attn.wv": "self_attn.v_proj.weight",
    "attn.bv": "self_attn.v_proj.bias",
    "attn.wo": "self_attn.o_proj.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "mlp.w_gate": "mlp.gate_proj.weight",
    "mlp.w_up": "mlp.up_proj.weight",
    "mlp.w_down": "mlp.down_proj.weight",
}


def hf_name(spec: ModelSpec, name: str) -> str:
    """The transformers name of canonical tensor `name` (the layout is the same: `nn.Linear`'s
    (out, in), q/k in the `rotate_half` order). A tied LM head is the embedding's tensor."""
    if name == "embed.weight" or (name == "lm_head.weight" and spec.tie_word_embeddings):
        return "model.embed_tokens.weight"
    if name in ("norm.weight", "lm_head.weight"):
        return {"norm.weight": "model.norm.weight", "lm_head.weight": "lm_head.weight"}[name]
    _, k, suffix = name.split(".", 2)
    return f"model.layers.{k}.{_LAYER_NAMES[suffix]}"


def safetensors_header(path: str) -> dict:
    """Tensor name -> {"dtype", "shape", "data_offsets"} of a .safetensors file, from its header
    alone (8 bytes of length, then JSON): no tensor data is read."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header


def weight_files(directory: str, what: str = "model.hf") -> dict[str, str]:
    """transformers tensor name -> the .safetensors file of `directory` holding it: from
    `model.safetensors.index.json` when there is one, else from the headers of every
    `*.safetensors`. Empty: the directory has no weights (a config-only model directory)."""
    index = os.path.join(directory, WEIGHTS_INDEX)
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as f:
                weight_map = json.load(f)["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{what} {index}: not a safetensors index (weight_map): {exc}") from None
        return {name: os.path.join(directory, file) for name, file in weight_map.items()}
    files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
    if not files and any(f.endswith((".bin", ".pt", ".pth")) for f in os.listdir(directory)):
        raise ValueError(
            f"{what} = {directory!r}: weights only as pickled .bin files; give *.safetensors "
            "(transformers: model.save_pretrained(dir)) or set model.hf_weights = false"
        )
    out: dict[str, str] = {}
    for file in files:
        path = os.path.join(directory, file)
        try:
            names = safetensors_header(path)
        except (OSError, ValueError, struct.error) as exc:
            raise ValueError(f"{what} {path}: not a safetensors file: {exc}") from None
        out.update(dict.fromkeys(names, path))
    return out
