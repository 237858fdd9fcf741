"""A member's TP shards as `torch.distributed.checkpoint` (DCP) chunks, and the one DCP checkpoint
of a whole job merged from them.

The runtime's TP shards are ResiHP's uneven head / FFN-column splits, which no DTensor placement
expresses, but each is one contiguous range of the full tensor along one dimension
(`model.shard_range`), so it is a DCP chunk: `ChunkStorageMetadata(offsets, sizes)` with the
range's start as the offset of that dimension. Replicated entries (norms, kv heads shared by two
shards, the embedding on every TP rank) are written once: each rank writes only the part it owns
(`model.owned_range`), so the chunks of a tensor are disjoint and tile it.

Each member saves alone (`no_dist=True`: no collective, so a save never waits on a peer and a dead
peer never hangs one) into its own directory `dev{d}/` with `ShardSavePlanner`, which emits one
`WriteItem` per owned chunk with its offsets in the full tensor. Once every saver wrote, the
controller merges their `.metadata` into one at the checkpoint's root (`merge`), whose storage
entries point into `dev{d}/`; `dcp.load` of that root then reads any tensor, or any slice of it,
from whatever chunks overlap it — the resharding to another Plan is DCP's (`load_tensors`).

Keys: `param/{name}`, `exp_avg/{name}`, `exp_avg_sq/{name}` (canonical names, `model.sharding`).
"""

from __future__ import annotations

import os
import pickle
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner, create_default_global_save_plan
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import SavePlan, TensorWriteData, WriteItem, WriteItemType

from resihp.core.model_spec import ModelSpec
from resihp.core.plan import Stage
from resihp.model import full_shape, owned_range, shard_range

# Every save and load here is single-process on purpose (`no_dist=True`), also once a member has
# left its process group with a write still in flight: DCP's warning about it says nothing.
warnings.filterwarnings("ignore", message=r".*assuming the intent is to (save|load) in a single process")
DCP_METADATA = ".metadata"  # DCP's own file name (filesystem._metadata_fn)


def key(kind: str, name: str) -> str:
    return f"{kind}/{name}"


def owned_chunks(
    spec: ModelSpec, stage: Stage, rank: int, shards: dict[str, torch.Tensor], kind: str = "param"
) -> dict[str, tuple[torch.Tensor, tuple[int, ...]]]:
    """key -> (the owned part of rank `rank`'s shard of each tensor in `shards`, a view; its offsets
    in the full tensor). Tensors the rank owns nothing of are left out."""
    out = {}
    for name, shard in shards.items():
        own = owned_range(spec, name, stage.tp_split, stage.ffn_split, rank)
        if own is None:
            continue
        dim, a, b = own
        held = shard_range(spec, name, stage.tp_split, stage.ffn_split, rank)
        start = 0 if held is None else held[1]
        offsets = [0] * shard.dim()
        offsets[dim] = a
        out[key(kind, name)] = (shard.narrow(dim, a - start, b - a), tuple(offsets))
    return out


class ShardSavePlanner(DefaultSavePlanner):
    """DCP's default save planner, but every tensor of the state dict is a chunk of a larger one:
    `chunks[key]` = (offsets, full size). The global plan of one member covers only its chunks, so
    DCP's whole-tensor coverage check is skipped here; `merge` checks the union instead."""

    def __init__(self, chunks: dict[str, tuple[tuple[int, ...], tuple[int, ...]]]) -> None:
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self.chunks = chunks

    def create_local_plan(self) -> SavePlan:
        items = []
        for k, t in self.state_dict.items():
            offsets, size = self.chunks[k]
            items.append(
                WriteItem(
                    index=MetadataIndex(k, torch.Size(offsets)),
                    type=WriteItemType.SHARD,
                    tensor_data=TensorWriteData(
                        chunk=ChunkStorageMetadata(torch.Size(offsets), t.size()),
                        properties=TensorProperties.create_from_tensor(t),
                        size=torch.Size(size),
                    ),
                )
            )
        self.plan = SavePlan(items)
        return self.plan

    def create_global_plan(self, all_plans: list[SavePlan]) -> tuple[list[SavePlan], Metadata]:
        self.global_plan, self.metadata = create_default_global_save_plan(all_plans)
        return self.global_plan, self.metadata

    def lookup_object(self, index: MetadataIndex):
        return self.state_dict[index.fqn]


def state_and_chunks(spec: ModelSpec, chunks: dict[str, tuple[torch.Tensor, tuple[int, ...]]]):
    """(state dict for `dcp.save`, the planner's chunk table) from `owned_chunks` output."""
    state = {k: t for k, (t, _) in chunks.items()}
    table = {k: (off, full_shape(spec, k.split("/", 1)[1])) for k, (_, off) in chunks.items()}
    return state, table


def save_chunks(directory: str, state: dict[str, torch.Tensor], table: dict) -> None:
    """Write `state` (chunks, `table` their offsets and full sizes) as a DCP checkpoint in
    `directory`, without any collective."""
    dcp.save(state, checkpoint_id=directory, planner=ShardSavePlanner(table), no_dist=True)


def merge(root: str, parts: list[str]) -> Metadata:
    """One DCP metadata at `root` from those of its subdirectories `parts` (each a `save_chunks`
    output); ValueError naming a tensor whose chunks overlap or leave part of it uncovered."""
    tensors: dict[str, TensorStorageMetadata] = {}
    storage = {}
    for part in parts:
        md = FileSystemReader(os.path.join(root, part)).read_metadata()
        for k, tmd in md.state_dict_metadata.items():
            have = tensors.setdefault(k, TensorStorageMetadata(tmd.properties, tmd.size, []))
            have.chunks.extend(tmd.chunks)
        for idx, info in md.storage_data.items():
            storage[idx] = type(info)(os.path.join(part, info.relative_path), info.offset, info.length)
    for k, tmd in tensors.items():
        check_cover(k, tmd)
    merged = Metadata(state_dict_metadata=tensors, storage_data=storage)
    tmp = os.path.join(root, f"{DCP_METADATA}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        pickle.dump(merged, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(root, DCP_METADATA))
    return merged


def check_cover(k: str, tmd: TensorStorageMetadata) -> None:
    """ValueError unless the chunks of tensor `k` are disjoint and tile it. Chunks are ranges
    along one dimension each (full along the others), so disjoint with the right total volume is
    a tiling."""
    size = tuple(tmd.size)
    spans = []
    for c in tmd.chunks:
        dims = [i for i, (o, n) in enumerate(zip(c.offsets, c.sizes)) if o or n != size[i]]
        if len(dims) > 1 or any(o + n > s for o, n, s in zip(c.offsets, c.sizes, size)):
            raise ValueError(f"{k}: chunk {tuple(c.offsets)} + {tuple(c.sizes)} is not a range of {size}")
        d = dims[0] if dims else 0
        spans.append((d, c.offsets[d], c.offsets[d] + c.sizes[d]))
    if len({d for d, _, _ in spans}) > 1:
        raise ValueError(f"{k}: chunks split it along different dimensions")
    ranges = sorted((a, b) for _, a, b in spans)
    extent = size[spans[0][0]] if size else 1
    overlap = any(b0 > a1 for (_, b0), (a1, _) in zip(ranges, ranges[1:]))
    if overlap or sum(b - a for a, b in ranges) != extent:
        raise ValueError(f"{k}: its chunks {ranges} do not tile [0, {extent})")


def load_tensors(root: str, spec: ModelSpec, keys: list[str], device: str = "cpu") -> dict[str, torch.Tensor]:
    """The full tensors `keys` of the DCP checkpoint at `root`, read by DCP from whatever chunks
    of the writing plan overlap them (no collective)."""
    state = {k: torch.empty(full_shape(spec, k.split("/", 1)[1]), device=device) for k in keys}
    dcp.load(state, checkpoint_id=root, no_dist=True)
    return state
