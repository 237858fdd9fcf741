"""Model architecture numbers (LLaMA / Qwen / Mistral family): the model facts planning and the
torch model need.

Presets follow cost-model.md §7 (released configs). Tiny presets are real, trainable shapes for
the CPU runtime; the same object drives the cost model and the torch model. A Hugging Face
`config.json` becomes a ModelSpec through `core.hf_config`; the numerical fields below (RoPE base
and scaling, RMSNorm epsilon, tied embeddings, q/k/v bias) are exactly the ones those
architectures vary, so one spec computes the same function as `transformers` does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3.1's RoPE frequency scaling (`rope_type = "llama3"`): wavelengths longer than
    `original_max_position_embeddings / low_freq_factor` are stretched by `factor`, shorter than
    `... / high_freq_factor` kept, and the band between interpolated smoothly (`model.layers`)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        for key in ("factor", "low_freq_factor", "high_freq_factor"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < math.inf:
                raise ValueError(f"rope_scaling.{key} = {v!r}: must be a number > 0")
        if not self.high_freq_factor > self.low_freq_factor:
            raise ValueError(
                f"rope_scaling.high_freq_factor = {self.high_freq_factor!r}: must exceed "
                f"low_freq_factor = {self.low_freq_factor!r}"
            )
        v = self.original_max_position_embeddings
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(
                f"rope_scaling.original_max_position_embeddings = {v!r}: must be a positive integer"
            )


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer with RMSNorm, RoPE and SwiGLU.

    `tie_word_embeddings`: the LM head is the embedding matrix. The runtime still holds it twice
    when the first and last layers live on different stages (Megatron's scheme: the two copies
    start equal and their gradients are summed before every step, so they stay bitwise equal);
    memory and FLOPs are therefore those of the untied model, which is what `cost` counts.
    """

    name: str
    num_layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    qkv_bias: bool = False
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False

    def __post_init__(self) -> None:
        for key in ("num_layers", "hidden", "heads", "kv_heads", "ffn", "vocab"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"model.{key} = {value!r}: must be a positive integer")
        if self.hidden % self.heads:
            raise ValueError(f"model.hidden = {self.hidden}: must be divisible by model.heads = {self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"model.kv_heads = {self.kv_heads}: must divide model.heads = {self.heads}")
        for key in ("rope_theta", "rms_norm_eps"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < math.inf:
                raise ValueError(f"model.{key} = {v!r}: must be a number > 0")
        for key in ("qkv_bias", "tie_word_embeddings"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"model.{key} = {getattr(self, key)!r}: must be true or false")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise ValueError(f"model.rope_scaling = {self.rope_scaling!r}: must be a RopeScaling or None")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def params_per_layer(self) -> int:
        """Attention (QKV + output) + SwiGLU (gate, up, down) + two RMSNorm weights (+ QKV bias)."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        qkv = h * (h + 2 * kv) + (h + 2 * kv if self.qkv_bias else 0)
        return qkv + h * h + 3 * h * self.ffn + 2 * h

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        """LM head plus the final RMSNorm."""
        return self.vocab * self.hidden + self.hidden

    @property
    def total_params(self) -> int:
        return self.num_layers * self.params_per_layer + self.embedding_params + self.head_params


def _p(name, layers, hidden, heads, kv, ffn, vocab, bias=False) -> ModelSpec:
    return ModelSpec(name, layers, hidden, heads, kv, ffn, vocab, bias)


PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        # Tiny CPU models: byte-level vocabulary (256) so the embedded corpus needs no tokenizer.
        _p("tiny", 4, 64, 8, 8, 176, 256),
        _p("tiny-gqa", 6, 96, 6, 2, 256, 256),
        _p("small", 8, 128, 8, 4, 352, 256),
        _p("llama2-7b", 32, 4096, 32, 32, 11008, 32000),
        _p("llama2-13b", 40, 5120, 40, 40, 13824, 32000),
        _p("llama2-30b", 60, 6656, 52, 52, 17920, 32000),
        _p("llama2-34b", 48, 8192, 64, 8, 22016, 32000),
        _p("llama2-70b", 80, 8192, 64, 8, 28672, 32000),
        _p("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, True),
        _p("qwen2.5-14b", 48, 5120, 40, 8, 13824, 152064, True),
        _p("qwen2.5-32b", 64, 5120, 40, 8, 27648, 152064, True),
        _p("qwen2.5-72b", 80, 8192, 64, 8, 29568, 152064, True),
        _p("llama3-8b", 32, 4096, 32, 8, 14336, 128256),
        _p("llama3-70b", 80, 8192, 64, 8, 28672, 128256),
        _p("llama3-405b", 126, 16384, 128, 8, 53248, 128256),
    )
}


def model_preset(name: str) -> ModelSpec:
    """The preset called `name`; ValueError listing the allowed names otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"model.preset = {name!r}: unknown; allowed: {', '.join(sorted(PRESETS))}") from None
