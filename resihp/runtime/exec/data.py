"""Micro-batch tensors from the deterministic packer: real bytes for `pystdlib`, a token file's
ids for `file`, synthetic bytes otherwise.

The embedded corpus is this interpreter's standard-library `.py` files (`pystdlib_files`), read as
bytes: token = byte, vocabulary 256, no tokenizer. `Workload.pack(iteration, G)` fixes which file
pieces land in micro-batch k; this module turns them into tensors, so the runtime and the reference
train on exactly the micro-batches the simulator reasons about.

Targets: the target of a token is the next byte of the same document. A segment cut by a window
boundary still predicts the document's true next byte for its last token; the last byte of a
document has no target (`IGNORE_INDEX`). Segment ids number the segments of the window 0, 1, ...;
positions restart at 0 at each segment start.

A token file (`[data] path`, `core.tokens.TokenFile`): the packer hands out document pieces by
stream position; the tokens come from the file's memory map, only those of the micro-batch (plus
one for the last target). The target rule is the same: a document's last token — its `eos_id` —
has no target, so no document learns to predict the next, unrelated one.

Other length kinds (`fixed`, lognormal ones) get synthetic documents: document d of iteration i is
a motif of 2..16 printable bytes, drawn from (workload.seed, i, d), repeated — learnable by copying,
and consistent across the windows a document spans.
"""

from __future__ import annotations

import functools
import os
import sysconfig
from dataclasses import dataclass

import numpy as np
import torch

from resihp.core.workload import PackedBatch, Workload, pystdlib_files
from resihp.model.loss import IGNORE_INDEX


@dataclass(frozen=True)
class MicroBatch:
    """One packed window of N tokens; all tensors (N,) int64."""

    input_ids: torch.Tensor
    target_ids: torch.Tensor  # IGNORE_INDEX where the document ends
    segment_ids: torch.Tensor
    positions: torch.Tensor

    @property
    def num_targets(self) -> int:
        return int((self.target_ids != IGNORE_INDEX).sum())


@functools.cache
def file_bytes(index: int) -> bytes:
    """Contents of standard-library file `index` of `pystdlib_files()` (cached in memory)."""
    paths, _ = pystdlib_files()
    with open(os.path.join(sysconfig.get_paths()["stdlib"], paths[index]), "rb") as f:
        return f.read()


def _synthetic(workload: Workload, iteration: int, doc: int, start: int, stop: int) -> np.ndarray:
    """Bytes [start, stop) of synthetic document `doc` of `iteration`."""
    rng = np.random.default_rng(np.random.SeedSequence([workload.seed, iteration, doc]))
    period = int(rng.integers(2, 17))
    motif = rng.integers(32, 127, size=period)
    return motif[np.arange(start, stop) % period]


def build_microbatch(workload: Workload, batch: PackedBatch, k: int, iteration: int) -> MicroBatch:
    """Tensors of micro-batch k of `batch` (= `workload.pack(iteration, batch.count)`)."""
    if not 0 <= k < batch.count:
        raise ValueError(f"micro-batch {k}: batch has {batch.count}")
    n = batch.seq_len
    inputs = np.empty(n, dtype=np.int64)
    targets = np.empty(n, dtype=np.int64)
    segments = np.empty(n, dtype=np.int64)
    positions = np.empty(n, dtype=np.int64)
    lo, hi = np.searchsorted(batch.seg_window, [k, k + 1])
    cursor = 0
    for local, s in enumerate(range(lo, hi)):
        doc, offset, length = int(batch.seg_doc[s]), int(batch.seg_offset[s]), int(batch.seg_len[s])
        if workload.tokens is not None:
            ends = offset + length >= int(batch.doc_len[doc])
            piece = workload.tokens.read(int(batch.doc_ids[doc]) + offset, length + (0 if ends else 1))
        elif workload.lengths == "pystdlib":
            data = file_bytes(int(batch.doc_ids[doc]))
            piece = np.frombuffer(data[offset : offset + length + 1], dtype=np.uint8).astype(np.int64)
            ends = offset + length >= len(data)
        else:
            piece = _synthetic(workload, iteration, doc, offset, offset + length + 1)
            ends = offset + length >= int(batch.doc_len[doc])
        window = slice(cursor, cursor + length)
        inputs[window] = piece[:length]
        targets[window] = piece[1 : length + 1] if not ends else np.append(piece[1:length], IGNORE_INDEX)
        segments[window] = local
        positions[window] = np.arange(length)
        cursor += length
    assert cursor == n, (cursor, n)
    return MicroBatch(*(torch.from_numpy(a) for a in (inputs, targets, segments, positions)))


def iteration_microbatches(workload: Workload, iteration: int, count: int) -> list[MicroBatch]:
    """All `count` micro-batches of the iteration's global batch, in order."""
    batch = workload.pack(iteration, count)
    return [build_microbatch(workload, batch, k, iteration) for k in range(count)]
