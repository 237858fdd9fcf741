"""`resihp export CHECKPOINT_DIR --hf OUT_DIR`: a checkpoint of `resihp train` as a Hugging Face
model directory (`config.json` + `model.safetensors`, fp32) that `transformers` loads.

CHECKPOINT_DIR is a checkpoint (`iter_N` with its `meta.json`) or a `run.checkpoint_dir`; it is
verified first and, like `--resume`, falls back to the newest intact one (`state.verify`). The full
tensors are read by DCP from the chunks of whatever plan wrote them (uneven TP splits, moved
layers: `state.checkpoint.load_full`, the one reader of the format),
then written under transformers' names (`core.hf_config.hf_name`). A model imported with
`[model] hf` keeps its config.json's architecture and other fields; a preset becomes a
LlamaForCausalLM (Qwen2ForCausalLM with q/k/v biases). Tokenizer files are not part of a
checkpoint: copy them from the model you started from.
"""

from __future__ import annotations

from resihp.core.files import check_dir


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="write a checkpoint as a Hugging Face model directory")
    p.add_argument(
        "checkpoint", metavar="CHECKPOINT_DIR", help="a checkpoint, or a checkpoint_dir with latest"
    )
    p.add_argument("--hf", required=True, metavar="OUT_DIR", help="the model directory to write")
    p.set_defaults(run=run)


def run(args) -> int:
    import os

    if not os.path.isdir(args.checkpoint):
        raise ValueError(f"CHECKPOINT_DIR {args.checkpoint}: no such directory")
    check_dir(args.hf, "--hf")
    from resihp.runtime.state.checkpoint import load_full
    from resihp.runtime.state.layout import spec_from_json
    from resihp.runtime.state.verify import newest_usable

    path, meta = newest_usable(args.checkpoint, "CHECKPOINT_DIR")
    from resihp.model.hf import save_hf

    spec = spec_from_json(meta["model"])
    state = load_full(path, moments=False, meta=meta).params
    weights = save_hf(args.hf, spec, state, meta.get("hf_config"))
    params = sum(t.numel() for t in state.values())
    print(
        f"exported {path} (iteration {meta['iteration']}, plan generation {meta['plan']['generation']}) "
        f"to {args.hf}: config.json, {os.path.basename(weights)} ({params} parameters, fp32)"
    )
    return 0
