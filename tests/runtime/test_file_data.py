"""Token files: documents keep their boundaries through the packer, every token of an epoch is
read exactly once, and the stream position survives a resume under another batch shape."""

import numpy as np
import pytest
import torch

from resihp.core.tokens import TokenFile
from resihp.core.workload import Workload
from resihp.model.loss import IGNORE_INDEX
from resihp.runtime.exec.data import iteration_microbatches

EOS = 0


def _file(tmp_path, dtype="uint16", seed=0, docs=40):
    """Documents of 1..40 tokens with ids 1..299, each ended by EOS; returns (TokenFile, stream)."""
    rng = np.random.default_rng(seed)
    parts = [np.append(rng.integers(1, 300, size=rng.integers(1, 41)), EOS) for _ in range(docs)]
    stream = np.concatenate(parts).astype(dtype)
    path = tmp_path / f"data-{dtype}-{seed}.bin"
    stream.tofile(path)
    return TokenFile(str(path), dtype, EOS), stream.astype(np.int64)


def _workload(tf, seq_len=16, mb=2):
    return Workload(seq_len, mb, "file", tokens=tf)


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_every_token_of_an_epoch_is_read_once_in_order(tmp_path, dtype):
    """Concatenated micro-batch inputs of consecutive iterations are the file, then the file again."""
    tf, stream = _file(tmp_path, dtype)
    wl, g = _workload(tf), 3
    need = 2 * len(stream) + 100
    got = []
    it = 0
    while sum(map(len, got)) < need:
        got += [mb.input_ids.numpy() for mb in iteration_microbatches(wl, it, g)]
        it += 1
    flat = np.concatenate(got)
    want = np.concatenate([stream] * (len(flat) // len(stream) + 1))[: len(flat)]
    assert np.array_equal(flat, want)


def test_documents_keep_their_boundaries(tmp_path):
    """Segments never cross an EOS; targets are the next token of the same document; EOS (a
    document's last token) has none; positions restart per segment; Σl² is the segments'."""
    tf, stream = _file(tmp_path)
    wl, g = _workload(tf), 4
    for it in range(6):
        batch = wl.pack(it, g)
        start = wl.token_start(it, g)
        for k, mb in enumerate(iteration_microbatches(wl, it, g)):
            seg, pos = mb.segment_ids.numpy(), mb.positions.numpy()
            inp, tgt = mb.input_ids.numpy(), mb.target_ids.numpy()
            base = start + k * wl.seq_len
            file_pos = (base + np.arange(wl.seq_len)) % len(stream)
            assert np.array_equal(inp, stream[file_pos])
            is_eos = inp == EOS
            assert np.all(tgt[is_eos] == IGNORE_INDEX)
            nxt = stream[(file_pos + 1) % len(stream)]
            assert np.array_equal(tgt[~is_eos], nxt[~is_eos])
            starts = np.flatnonzero(np.diff(seg)) + 1
            assert np.all(inp[starts - 1] == EOS)  # inside a window, a segment starts after an EOS only
            assert np.all(is_eos[:-1] <= (seg[1:] != seg[:-1]))  # and after every EOS
            assert np.all(pos[starts] == 0) and pos[0] == 0
            lengths = np.bincount(seg)
            assert batch.sum_sq[k] == float((lengths.astype(np.float64) ** 2).sum())


def test_resume_reads_on_from_the_checkpointed_token(tmp_path):
    """`at_position(i, t)` makes iteration i start at stream token t: the same batches as the
    uninterrupted run under the same shape, the following tokens under another shape."""
    tf, stream = _file(tmp_path)
    wl = _workload(tf)
    pos = wl.token_start(5, 3)
    assert pos == 5 * 3 * 16
    same = wl.at_position(5, pos)
    for it in (5, 6, 9):
        a, b = iteration_microbatches(wl, it, 3), iteration_microbatches(same, it, 3)
        assert all(torch.equal(x.input_ids, y.input_ids) for x, y in zip(a, b))
    other = Workload(8, 5, "file", tokens=tf).at_position(5, pos)  # seq_len 8, 5 micro-batches
    first = iteration_microbatches(other, 5, 5)[0].input_ids.numpy()
    assert np.array_equal(first, stream[(pos + np.arange(8)) % len(stream)])


def test_bad_files_are_refused_up_front(tmp_path):
    tf, _ = _file(tmp_path)
    tf.check(vocab=300)
    with pytest.raises(ValueError, match="token id 299 .* vocabulary of 256"):
        tf.check(vocab=256)
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x01\x00\x02")
    with pytest.raises(ValueError, match="3 bytes is not a non-empty whole number of uint16"):
        TokenFile(str(odd), "uint16", 0).check(300)
    with pytest.raises(ValueError, match=r"data.eos_id = 70000: must be a token id in \[0, 65535\]"):
        TokenFile(str(odd), "uint16", 70000)
    with pytest.raises(ValueError, match="data.dtype = 'int8'"):
        TokenFile(str(odd), "int8", 0)
    with pytest.raises(ValueError, match="no such file"):
        TokenFile(str(tmp_path / "none.bin")).check(300)
