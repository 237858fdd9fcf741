"""Periodic checkpoints of the committed state, and whole-job restarts (`resihp train --resume DIR`).

Format: plain `torch.save` files, not `torch.distributed.checkpoint`. The runtime's TP shards are
ResiHP's uneven head / FFN-column splits (q, k, v, o and gate/up/down sliced per head group), which
are not DTensor placements, and a checkpoint must load into any other Plan; DCP would need the
full tensors gathered anyway. So every device of a *source stage* (`transfer.source_stages` over
the plan's devices: the first replica holding each tensor) writes the shards it sources, with
their AdamW moments, and the loader gathers full tensors (`gather_tensor`) and slices them for the
new Plan — the same reshard as a generation change, from disk instead of a broadcast.

Layout of `run.checkpoint_dir`:

    iter_00000003/dev0.pt ...   shards after 3 committed iterations: {"params", "moments"} by name
    iter_00000003/meta.pt       {"iteration": 3 (next to run = committed steps), "plan": the Plan
                                 that wrote the shards, "savers": [devices], "data": the data
                                 position (below), "hf_config": the imported model's config.json}
    latest                      "iter_00000003" once meta.pt is written (the commit of the checkpoint)

A member saves right after the optimizer step of a committed iteration k with (k + 1) % every == 0
and reports `saved`; the controller writes `meta.pt` and `latest` once every saver reported, so a
checkpoint without `meta.pt` (a crash mid-save) is never loaded. Writes go to a temporary name and
are renamed into place.

The data position: the embedded corpus and the synthetic kinds pack iteration k as a pure
function of k, so `iteration` is their position. A token file is read in order, and its
position is the stream token iteration k starts at, `meta["data"]["tokens"]`: a resumed run
starts there (`Workload.at_position`) even under another seq_len or micro-batch count, so it
reads on where the checkpointed run stopped. `load_full` is the one way to read the full tensors
back (resume and `resihp export`); a format change (DCP) replaces it and the saver.
"""

from __future__ import annotations

import os

import torch

from resihp.core.plan import Plan
from resihp.core.workload import Workload
from resihp.model import gather_tensor, stage_param_names

from .transfer import Holding, StageInit, source_stages

META = "meta.pt"


def iter_dir(root: str, iteration: int) -> str:
    return os.path.join(root, f"iter_{iteration:08d}")


def savers(plan: Plan) -> list[int]:
    """Devices that write a checkpoint of `plan`: those of its source stages."""
    sources = source_stages(plan, set(plan.devices()))
    return sorted({d for st in sources.values() for d in st.devices})


def _atomic_save(obj, path: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def save_shard(root: str, iteration: int, plan: Plan, device: int, holding: Holding) -> bool:
    """Write the shards `device` sources under `plan` after `iteration` committed steps; False when
    the device sources nothing (it writes no file)."""
    names = [n for n, st in source_stages(plan, set(plan.devices())).items() if device in st.devices]
    if not names:
        return False
    path = iter_dir(root, iteration)
    os.makedirs(path, exist_ok=True)
    body = {
        "params": {n: holding.params[n] for n in names},
        "moments": None
        if holding.moments is None
        else tuple({n: m[n] for n in names} for m in holding.moments),
    }
    _atomic_save(body, os.path.join(path, f"dev{device}.pt"))
    return True


def data_position(workload: Workload, iteration: int, plan: Plan) -> dict | None:
    """Where iteration `iteration`'s data starts (None: `iteration` itself says it)."""
    if workload.tokens is None:
        return None
    start = workload.token_start(iteration, plan.global_microbatches)
    return {"path": workload.tokens.path, "tokens": start}


def write_meta(root: str, iteration: int, plan: Plan, job=None) -> str:
    """Complete the checkpoint of `iteration` (every saver has written); returns its directory.
    `job` (the `JobSpec`): its data position and Hugging Face config go into the meta too."""
    path = iter_dir(root, iteration)
    meta = {"iteration": iteration, "plan": plan, "savers": savers(plan)}
    if job is not None:
        meta.update(data=data_position(job.workload, iteration, plan), hf_config=job.hf_config)
    _atomic_save(meta, os.path.join(path, META))
    tmp = os.path.join(root, f"latest.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(os.path.basename(path) + "\n")
    os.replace(tmp, os.path.join(root, "latest"))
    return path


def resolve(path: str) -> str:
    """The checkpoint directory for `--resume PATH`: PATH itself when it holds `meta.pt`, else the
    one named by PATH/latest; ValueError when there is none."""
    if os.path.isfile(os.path.join(path, META)):
        return path
    latest = os.path.join(path, "latest")
    if os.path.isfile(latest):
        with open(latest) as f:
            found = os.path.join(path, f.read().strip())
        if os.path.isfile(os.path.join(found, META)):
            return found
    raise ValueError(f"--resume {path}: no complete checkpoint (no {META}, no 'latest')")


def load_meta(path: str) -> dict:
    return torch.load(os.path.join(path, META), weights_only=False)


def load_full(path: str, names=None, moments: bool = True) -> StageInit:
    """The full (unsharded) tensors `names` (default: the whole model) of the checkpoint at
    `path`, gathered from the shards of the plan that wrote it; with `moments`, their AdamW
    moments too (when the checkpoint has any)."""
    meta = load_meta(path)
    old: Plan = meta["plan"]
    spec = old.model
    names = stage_param_names(spec, (0, spec.num_layers)) if names is None else names
    sources = source_stages(old, set(old.devices()))
    shards: dict[int, dict] = {}
    kinds = 1
    full: list[dict[str, torch.Tensor]] = [{}, {}, {}]
    for name in names:
        st = sources[name]
        for d in st.devices:
            if d not in shards:
                shards[d] = torch.load(
                    os.path.join(path, f"dev{d}.pt"), weights_only=True, map_location="cpu"
                )
        kinds = 3 if moments and shards[st.devices[0]]["moments"] is not None else 1
        for k in range(kinds):
            pieces = [
                shards[d]["params"][name] if k == 0 else shards[d]["moments"][k - 1][name] for d in st.devices
            ]
            full[k][name] = gather_tensor(spec, name, pieces, st.tp_split, st.ffn_split)
    return StageInit(full[0], (full[1], full[2]) if kinds == 3 else None, meta["iteration"])


def load_init(path: str, new: Plan, device: int) -> StageInit | None:
    """This device's stage under `new`, as full tensors from the checkpoint at `path` (None: standby)."""
    where = new.stage_of(device)
    if where is None:
        return None
    st_new = new.replicas[where[0]][where[1]]
    return load_full(path, stage_param_names(new.model, st_new.layers))
