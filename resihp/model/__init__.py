"""LLaMA-style decoder, addressable by layer range and TP shard; knows nothing of torch.distributed."""

from .attention import Docs, attention
from .init import init_state, init_tensor
from .layers import DecoderLayer, identity, rms_norm, rope_tables, segment_mask
from .loss import IGNORE_INDEX, iteration_loss, microbatch_loss
from .sharding import (
    apply_tp_grad_buffer,
    ffn_range,
    full_shape,
    gather_state,
    gather_tensor,
    head_range,
    kv_is_replicated,
    kv_range,
    layer_param_names,
    normalize_split,
    owned_range,
    owned_sq_sum,
    shard_range,
    slice_state,
    slice_tensor,
    stage_param_names,
    sync_tp_grads,
    tp_grad_buffer,
)
from .stage import StageModel, build_stage

__all__ = [
    "IGNORE_INDEX",
    "DecoderLayer",
    "Docs",
    "StageModel",
    "apply_tp_grad_buffer",
    "attention",
    "build_stage",
    "ffn_range",
    "full_shape",
    "gather_state",
    "gather_tensor",
    "head_range",
    "identity",
    "init_state",
    "init_tensor",
    "iteration_loss",
    "kv_is_replicated",
    "kv_range",
    "layer_param_names",
    "microbatch_loss",
    "normalize_split",
    "owned_range",
    "owned_sq_sum",
    "rms_norm",
    "rope_tables",
    "segment_mask",
    "shard_range",
    "slice_state",
    "slice_tensor",
    "stage_param_names",
    "sync_tp_grads",
    "tp_grad_buffer",
]
