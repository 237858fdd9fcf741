"""Deterministic packing and the length distributions."""

import numpy as np
import pytest

from resihp.core import Workload
from resihp.core.workload import pystdlib_files


@pytest.mark.parametrize("lengths", ["fixed", "c4", "github", "sharegpt", "longctx", "pystdlib"])
def test_packing_is_deterministic_and_exact(lengths):
    """Same (seed, iteration) gives the same batch; every window holds exactly seq_len tokens."""
    w = Workload(4096, 4, lengths, seed=3)
    a, b = w.pack(7, 16), w.pack(7, 16)
    assert np.array_equal(a.seg_len, b.seg_len) and np.array_equal(a.sum_sq, b.sum_sq)
    assert np.array_equal(np.bincount(a.seg_window, weights=a.seg_len, minlength=16), np.full(16, 4096))
    assert np.allclose(a.sum_sq, [sum(x * x for x in a.lengths(k)) for k in range(16)])
    assert (a.sum_sq <= 4096**2).all() and (a.sum_sq >= 4096).all()
    assert not np.array_equal(w.pack(8, 16).sum_sq, a.sum_sq) or lengths == "fixed"


def test_sum_sq_statistics_match_cost_model_table():
    """Mean Σℓ²/S² of packed github and c4 windows is near cost-model.md §9.3's table."""
    for lengths, seq, expected in [("c4", 8192, 0.153), ("github", 8192, 0.71), ("github", 32768, 0.49)]:
        ratios = np.concatenate(
            [Workload(seq, 1, lengths, seed=s).pack(0, 256).sum_sq / seq**2 for s in range(4)]
        )
        assert ratios.mean() == pytest.approx(expected, rel=0.2), lengths


def test_pystdlib_segments_point_into_real_files():
    """pystdlib documents are real stdlib files: segment offsets and lengths fit inside them."""
    paths, sizes = pystdlib_files()
    assert len(paths) > 100 and all(p.endswith(".py") for p in paths)
    batch = Workload(2048, 2, "pystdlib", seed=1).pack(0, 8)
    for k in range(8):
        for doc, offset, length in batch.segments(k):
            assert 0 <= offset and offset + length <= sizes[doc]


def test_fixed_doc_len():
    """fixed lengths with doc_len pack equal documents: Σℓ² = S·doc_len."""
    b = Workload(4096, 1, "fixed", doc_len=1024).pack(0, 4)
    assert np.allclose(b.sum_sq, 4 * 1024**2)


@pytest.mark.parametrize(
    "kwargs, key",
    [
        (dict(seq_len=0, num_microbatches=1), "seq_len"),
        (dict(seq_len=8, num_microbatches=0), "microbatches"),
        (dict(seq_len=8, num_microbatches=1, lengths="pile2"), "workload.lengths"),
        (dict(seq_len=8, num_microbatches=1, lengths="c4", doc_len=4), "workload.doc_len"),
    ],
)
def test_bad_workload(kwargs, key):
    """Bad workload values raise ValueError naming the key."""
    with pytest.raises(ValueError, match=key):
        Workload(**kwargs)
