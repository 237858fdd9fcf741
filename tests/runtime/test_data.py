import os
import sysconfig

import numpy as np
import pytest
import torch

from resihp.core.workload import Workload, pystdlib_files
from resihp.model.loss import IGNORE_INDEX
from resihp.runtime.exec.data import build_microbatch, file_bytes, iteration_microbatches


def _fields(mb):
    return (mb.input_ids, mb.target_ids, mb.segment_ids, mb.positions)


@pytest.mark.parametrize("lengths", ["pystdlib", "fixed", "github"])
def test_same_iteration_gives_identical_tensors(lengths):
    """The same (seed, iteration) always yields the same micro-batch tensors; another iteration differs."""
    doc_len = 50 if lengths == "fixed" else None
    wl = Workload(seq_len=128, num_microbatches=2, lengths=lengths, seed=3, doc_len=doc_len)
    a, b = iteration_microbatches(wl, 4, 3), iteration_microbatches(wl, 4, 3)
    for x, y in zip(a, b):
        assert all(torch.equal(s, t) for s, t in zip(_fields(x), _fields(y)))
    c = iteration_microbatches(wl, 5, 3)
    assert not torch.equal(a[0].input_ids, c[0].input_ids)
    for mb in a:
        assert all(t.shape == (128,) and t.dtype == torch.int64 for t in _fields(mb))


def test_pystdlib_bytes_come_from_the_named_file():
    """Every segment's tokens and targets are the named stdlib file's bytes at the named offset."""
    wl = Workload(seq_len=256, num_microbatches=4, lengths="pystdlib", seed=1)
    batch = wl.pack(2, 4)
    paths, sizes = pystdlib_files()
    for k in range(4):
        mb = build_microbatch(wl, batch, k, 2)
        cursor = 0
        for seg, (doc, offset, length) in enumerate(batch.segments(k)):
            with open(os.path.join(sysconfig.get_paths()["stdlib"], paths[doc]), "rb") as f:
                data = np.frombuffer(f.read(), dtype=np.uint8)
            assert file_bytes(doc) == data.tobytes()
            assert len(data) == sizes[doc], paths[doc]
            window = slice(cursor, cursor + length)
            assert mb.input_ids[window].tolist() == data[offset : offset + length].tolist()
            assert (mb.segment_ids[window] == seg).all()
            assert mb.positions[window].tolist() == list(range(length))
            nxt = data[offset + 1 : offset + length + 1].tolist()
            ends = offset + length == len(data)
            assert mb.target_ids[window].tolist() == nxt + ([IGNORE_INDEX] if ends else [])
            cursor += length


def test_targets_ignore_document_ends_only():
    """With fixed-length documents exactly the last token of each document has no target."""
    wl = Workload(seq_len=100, num_microbatches=2, lengths="fixed", doc_len=30)
    mbs = iteration_microbatches(wl, 0, 2)
    ids = torch.cat([m.input_ids for m in mbs])  # the two windows form one token stream
    tgt = torch.cat([m.target_ids for m in mbs])
    ignored = (tgt == IGNORE_INDEX).nonzero().flatten().tolist()
    assert ignored == [29, 59, 89, 119, 149, 179]  # document ends; the stream cut at 100 is not one
    keep = tgt != IGNORE_INDEX
    keep[-1] = False  # the stream's last target lies beyond it
    assert torch.equal(tgt[:-1][keep[:-1]], ids[1:][keep[:-1]])
    assert mbs[1].positions[0] == 0 and mbs[1].positions[19] == 19 and mbs[1].positions[20] == 0
