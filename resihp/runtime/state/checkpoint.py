"""Periodic checkpoints of the committed state, as `torch.distributed.checkpoint` (DCP), and the
one reader of them (`resihp train --resume DIR`, `resihp export`, the in-job restart).

Layout of `run.checkpoint_dir`:

    iter_00000003/dev0/__0_0.distcp   device 0's owned chunks after 3 committed iterations (DCP,
    iter_00000003/dev0/.metadata      `chunks.py`), with their AdamW moments
    iter_00000003/dev0/checksums.json {file: {"bytes", "sha256"}} of that directory's files
    iter_00000003/.metadata           the merged DCP metadata: every chunk of every tensor
    iter_00000003/meta.json           written last: the commit of the checkpoint (`write_meta`)
    latest                            "iter_00000003" once its meta.json is written

`meta.json` is plain JSON (nothing pickled; no Plan object): {"format", "iteration" (the next
iteration to run = committed optimizer steps), "model" (the ModelSpec's fields), "plan" (the
writing Plan's `to_dict()`, for information: loading needs only DCP's chunk offsets), "savers",
"moments" (whether AdamW moments were saved), "data" (below), "rng", "optim", "hf_config" (the
imported model's config.json) and "files": relative path -> {"bytes", "sha256"} of every file the
checkpoint consists of, so that `verify.py` detects a missing, truncated or corrupt piece before
any member starts.

Saving: a member saves right after the optimizer step of a committed iteration k with
(k + 1) % every == 0 (`Saver.save`): it copies its committed shards (the `Holding`), hands them to
`dcp.async_save` and goes on training while a background thread writes them and their checksums
(one write in flight per member: the next save waits for it); `Saver.poll` says which writes are
complete, and the member reports `Saved` for those. The
controller completes the checkpoint once every saver reported (`write_meta`: merged DCP metadata,
`meta.json`, `latest`, then retention: the `keep` newest complete checkpoints stay, every older
`iter_*` directory is removed). A checkpoint without `meta.json` (a crash mid-save) is never
loaded. On NCCL members the write runs on this module's own thread instead: `async_save` refuses a
default process group without a CPU backend even with `no_dist=True`.

RNG: training draws no random numbers after initialisation; data packing is a pure function of
(workload seed, iteration) and initialisation of `run.seed`, both in "rng". The data position:
the embedded corpus and the synthetic kinds pack iteration k as a pure function of k, so
`iteration` is their position; a token file is read in order, and its position is the stream
token iteration k starts at, `meta["data"]["tokens"]` (`Workload.at_position`).
"""

from __future__ import annotations

import json
import os
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict

import torch

from resihp.core.plan import Plan
from resihp.core.workload import Workload
from resihp.model import stage_param_names

from .layout import (
    CHECKSUMS,
    FORMAT,
    LATEST,
    META,
    complete,
    file_sums,
    iter_dir,
    iterations,
    spec_from_json,
    spec_to_json,
    write_json,
)
from .transfer import MOMENTS, Holding, StageInit, source_stages


def _chunks():
    """`chunks.py`, imported on first use: it loads `torch.distributed.checkpoint` (seconds on a
    loaded machine), which a run without checkpoints, and the controller until its first
    checkpoint completes, never needs."""
    from . import chunks

    return chunks


def savers(plan: Plan) -> list[int]:
    """Devices that write a checkpoint of `plan`: those of its source stages."""
    sources = source_stages(plan, set(plan.devices()))
    return sorted({d for st in sources.values() for d in st.devices})


def device_state(plan: Plan, device: int, holding: Holding) -> tuple[dict, dict]:
    """(DCP state dict, chunk table) of what `device` writes under `plan`: the owned chunks of the
    tensors it sources (`source_stages`), parameters and moments; empty when it sources nothing."""
    spec, chunks = plan.model, _chunks()
    sources = source_stages(plan, set(plan.devices()))
    names = [n for n, st in sources.items() if device in st.devices]
    owned: dict = {}
    kinds = [("param", holding.params)]
    if holding.moments is not None:
        kinds += list(zip(MOMENTS, holding.moments))
    for name in names:
        st = sources[name]
        rank = st.devices.index(device)
        for kind, tensors in kinds:
            owned.update(chunks.owned_chunks(spec, st, rank, {name: tensors[name]}, kind))
    return chunks.state_and_chunks(spec, owned)


class _AsIs:
    """A DCP stager that stages nothing: a `Holding` is already a private copy of the committed
    state, so training may go on at once (DCP's default stager would copy it again)."""

    _synchronize_after_execute = False
    should_synchronize_after_execute = False

    def stage(self, state_dict):
        return state_dict

    def close(self) -> None:
        pass


class Saver:
    """One member's checkpoint writes, in the background. `mode`: "async" (`dcp.async_save` where
    the default process group has a CPU backend, else this module's thread), "sync" (write and
    checksum before returning: what the benchmark compares against)."""

    def __init__(self, mode: str = "async") -> None:
        assert mode in ("async", "sync"), mode
        self.mode = mode
        self.pending: list[tuple[int, int, Future]] = []  # (iteration, generation, done)
        self._pool: ThreadPoolExecutor | None = None

    def save(
        self, root: str, iteration: int, generation: int, plan: Plan, device: int, holding: Holding
    ) -> bool:
        """Start writing `device`'s part of the checkpoint of `iteration` (committed steps) under
        `plan`; False when the device sources nothing (it writes no file). At most one write is in
        flight: a save first waits for the one before (so copies never pile up in memory)."""
        state, table = device_state(plan, device, holding)
        if not state:
            return False
        chunks = _chunks()
        for _, _, earlier in self.pending:
            earlier.exception()  # (its outcome is reported by the next `poll`)
        directory = os.path.join(iter_dir(root, iteration), f"dev{device}")
        os.makedirs(directory, exist_ok=True)
        done: Future = Future()
        self.pending.append((iteration, generation, done))

        def finish(written: Future | None) -> None:
            try:
                if written is not None:
                    written.result()
                names = sorted(n for n in os.listdir(directory) if not n.startswith(CHECKSUMS))
                write_json(file_sums(directory, names), os.path.join(directory, CHECKSUMS))
                done.set_result(None)
            except BaseException as e:  # handed to the member by `poll`
                done.set_exception(e)

        if self.mode == "sync":
            chunks.save_chunks(directory, state, table)
            finish(None)
        elif _cpu_backend():
            planner = chunks.ShardSavePlanner(table)
            written = torch.distributed.checkpoint.async_save(
                state, checkpoint_id=directory, planner=planner, async_stager=_AsIs(), no_dist=True
            )
            written.add_done_callback(finish)
        else:
            self._pool = self._pool or ThreadPoolExecutor(1, thread_name_prefix="checkpoint")
            self._pool.submit(chunks.save_chunks, directory, state, table).add_done_callback(finish)
        return True

    def poll(self) -> list[tuple[int, int]]:
        """(iteration, generation) of every write complete since the last call, in order; a failed
        write raises its error."""
        out = []
        while self.pending and self.pending[0][2].done():
            iteration, generation, done = self.pending.pop(0)
            done.result()
            out.append((iteration, generation))
        return out

    def wait(self) -> list[tuple[int, int]]:
        """Block until every write is complete; then as `poll`."""
        for _, _, done in self.pending:
            done.exception()
        return self.poll()


def _cpu_backend() -> bool:
    dist = torch.distributed
    if not dist.is_initialized():
        return True
    return torch.device("cpu") in dist.distributed_c10d._get_default_group()._device_types


def data_position(workload: Workload, iteration: int, plan: Plan) -> dict | None:
    """Where iteration `iteration`'s data starts (None: `iteration` itself says it)."""
    if workload.tokens is None:
        return None
    start = workload.token_start(iteration, plan.global_microbatches)
    return {"path": workload.tokens.path, "tokens": start}


def write_meta(root: str, iteration: int, plan: Plan, job=None, keep: int | None = None) -> str:
    """Complete the checkpoint of `iteration` (every saver has written): the merged DCP metadata,
    `meta.json` with every file's checksum, `latest`; then keep the `keep` newest complete
    checkpoints (None: all). `job` (the `JobSpec`): data position, RNG, optimizer, Hugging Face
    config. Returns the checkpoint's directory."""
    path = iter_dir(root, iteration)
    parts = [f"dev{d}" for d in savers(plan)]
    chunks = _chunks()
    merged = chunks.merge(path, parts)
    files = file_sums(path, [chunks.DCP_METADATA])
    for part in parts:
        with open(os.path.join(path, part, CHECKSUMS)) as f:
            files.update({f"{part}/{n}": v for n, v in json.load(f).items()})
    moments = any(k.startswith(f"{MOMENTS[0]}/") for k in merged.state_dict_metadata)
    meta = {"format": FORMAT, "iteration": iteration, "model": spec_to_json(plan.model),
            "plan": plan.to_dict(), "savers": savers(plan), "moments": moments, "files": files}  # fmt: skip
    if job is not None:
        rng = {"seed": job.seed, "data_seed": getattr(job.workload, "seed", None)}
        meta.update(data=data_position(job.workload, iteration, plan), hf_config=job.hf_config, rng=rng,
                    optim=asdict(job.optim))  # fmt: skip
    write_json(meta, os.path.join(path, META))
    tmp = os.path.join(root, f"latest.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(os.path.basename(path) + "\n")
    os.replace(tmp, os.path.join(root, LATEST))
    if keep is not None:
        prune(root, keep)
    return path


def prune(root: str, keep: int) -> list[int]:
    """Keep the `keep` newest complete checkpoints of `root`; remove every `iter_*` directory older
    than the oldest kept (complete or not: a crash mid-save leaves an incomplete one). Newer
    incomplete ones may be in flight and stay. Returns the iterations removed."""
    assert keep >= 1, keep
    done = complete(root)
    if len(done) <= keep:
        return []
    oldest = done[-keep]
    gone = [k for k in iterations(root) if k < oldest]
    for k in gone:
        shutil.rmtree(iter_dir(root, k), ignore_errors=True)
    return gone


def load_meta(path: str) -> dict:
    """The `meta.json` of the checkpoint at `path` (plain JSON; `verify.verify` checks it first)."""
    with open(os.path.join(path, META)) as f:
        return json.load(f)


def load_full(path: str, names=None, moments: bool = True, meta: dict | None = None) -> StageInit:
    """The full (unsharded) tensors `names` (default: the whole model) of the checkpoint at
    `path`, read by DCP from the chunks of whatever plan wrote them; with `moments`, their AdamW
    moments too (when the checkpoint has any)."""
    meta = load_meta(path) if meta is None else meta
    spec = spec_from_json(meta["model"])
    names = stage_param_names(spec, (0, spec.num_layers)) if names is None else list(names)
    kinds = ["param"] + (list(MOMENTS) if moments and meta["moments"] else [])
    chunks = _chunks()
    got = chunks.load_tensors(path, spec, [chunks.key(k, n) for k in kinds for n in names])
    full = [{n: got[chunks.key(k, n)] for n in names} for k in kinds]
    return StageInit(full[0], (full[1], full[2]) if len(kinds) == 3 else None, meta["iteration"])


def load_init(path: str, new: Plan, device: int) -> StageInit | None:
    """This device's stage under `new`, as full tensors from the checkpoint at `path` (None: standby)."""
    where = new.stage_of(device)
    if where is None:
        return None
    st_new = new.replicas[where[0]][where[1]]
    return load_full(path, stage_param_names(new.model, st_new.layers))
