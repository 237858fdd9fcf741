"""Hugging Face weights in and out: a stage shard read from safetensors slices, a full state
written as a model directory that `transformers` loads.

Reading never loads a whole file: `read_shard` opens each `.safetensors` file with `safe_open`
(a memory map) and takes `get_slice(name)[a:b]` of exactly the rows (or columns, for `o_proj`
and `down_proj`) TP rank `rank` of the stage holds (`sharding.shard_range`), so a member reads
its shard and nothing else; tensors stored in bf16 / fp16 become fp32. The names are
`core.hf_config.hf_name`'s, the one mapping both directions use. A tied LM head is read from
the embedding's tensor and written only as that tensor.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Mapping

import safetensors
import safetensors.torch
import torch

from resihp.core.hf_config import CONFIG, config_from_spec, hf_name, safetensors_header, weight_files
from resihp.core.model_spec import ModelSpec

from .sharding import full_shape, shard_range, stage_param_names

FLOAT_DTYPES = ("F32", "BF16", "F16", "F64")
WEIGHTS = "model.safetensors"


def check_weights(directory: str, spec: ModelSpec, what: str = "model.hf") -> bool:
    """Whether `directory` has weights for `spec`: False when it has none; ValueError naming the
    tensor when one is missing, has another shape or is not floating point. Headers only."""
    files = weight_files(directory, what)
    if not files:
        return False
    headers = {path: safetensors_header(path) for path in set(files.values())}
    for name in stage_param_names(spec, (0, spec.num_layers)):
        hf = hf_name(spec, name)
        if hf not in files or hf not in headers[files[hf]]:
            raise ValueError(f"{what} = {directory!r}: no tensor {hf} (for {name}) in its safetensors files")
        entry = headers[files[hf]][hf]
        if tuple(entry["shape"]) != full_shape(spec, name):
            raise ValueError(
                f"{what} {files[hf]}: {hf} has shape {entry['shape']}; config.json implies "
                f"{list(full_shape(spec, name))}"
            )
        if entry["dtype"] not in FLOAT_DTYPES:
            raise ValueError(
                f"{what} {files[hf]}: {hf} is {entry['dtype']}; allowed: {', '.join(FLOAT_DTYPES)}"
            )
    return True


def read_shard(
    directory: str, spec: ModelSpec, layers: tuple[int, int], tp_split, ffn_split, rank: int
) -> dict[str, torch.Tensor]:
    """TP shard `rank` of the stage holding `layers`, as fp32 shard tensors by canonical name,
    read slice by slice from the safetensors files of `directory`."""
    files = weight_files(directory)
    by_file: dict[str, list[str]] = defaultdict(list)
    for name in stage_param_names(spec, layers):
        by_file[files[hf_name(spec, name)]].append(name)
    out: dict[str, torch.Tensor] = {}
    for path, names in by_file.items():
        with safetensors.safe_open(path, framework="pt") as f:
            for name in names:
                piece = f.get_slice(hf_name(spec, name))
                idx = shard_range(spec, name, tp_split, ffn_split, rank)
                if idx is None:
                    t = piece[:]
                elif idx[0] == 0:
                    t = piece[idx[1] : idx[2]]
                else:
                    t = piece[:, idx[1] : idx[2]]
                out[name] = t.to(torch.float32).contiguous()
    return out


def read_full(directory: str, spec: ModelSpec) -> dict[str, torch.Tensor]:
    """Every tensor of the model, unsharded (the single-process reference's start)."""
    return read_shard(directory, spec, (0, spec.num_layers), None, None, 0)


def to_hf_state(spec: ModelSpec, full: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers names -> contiguous tensors of a full canonical state (a tied LM head once)."""
    out = {}
    for name in stage_param_names(spec, (0, spec.num_layers)):
        if name == "lm_head.weight" and spec.tie_word_embeddings:
            assert torch.equal(full[name], full["embed.weight"]), "tied LM head and embedding diverged"
            continue
        out[hf_name(spec, name)] = full[name].detach().to(torch.float32).contiguous().clone()
    return out


def save_hf(out_dir: str, spec: ModelSpec, full: Mapping[str, torch.Tensor], base: dict | None = None) -> str:
    """Write `out_dir/config.json` (`hf_config.config_from_spec`) and `out_dir/model.safetensors`
    (fp32) for a full canonical state; returns the weights' path."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, CONFIG), "w", encoding="utf-8") as f:
        json.dump(config_from_spec(spec, base), f, indent=2, sort_keys=True)
        f.write("\n")
    path = os.path.join(out_dir, WEIGHTS)
    safetensors.torch.save_file(to_hf_state(spec, full), path, metadata={"format": "pt"})
    return path
