"""Document-length distributions and the deterministic packer shared by simulator and runtime.

An iteration's global batch is `G` packed micro-batches of exactly `seq_len` tokens. Documents are
drawn from a seeded stream that depends only on (seed, iteration), packed in order, and a document
that crosses a window boundary becomes two segments with their own attention blocks. Attention cost
grows with the sum of squared segment lengths (cost-model.md §9.3), which `PackedBatch.sum_sq`
carries per micro-batch. The runtime slices real token arrays with `PackedBatch.segments`, so it
trains on exactly the micro-batches the simulator reasons about.

A tokenized file (`lengths = "file"`, `Workload.tokens`: `core.tokens.TokenFile`) is not drawn
but read in order: iteration i packs the file's documents overlapping the stream range
[t_i, t_i + G·seq_len), t_i = `token_start(i, G)`, with the same cutting rule; consecutive
iterations read consecutive ranges, so every token of an epoch is trained on exactly once. The
position is a pure function of the iteration given `token_origin`, which a resumed run sets from
its checkpoint (`at_position`), so it reads on from the token the checkpoint reached even under
another global batch shape.
"""

from __future__ import annotations

import functools
import os
import sysconfig
from dataclasses import dataclass, replace

import numpy as np

from .tokens import TokenFile

# name -> (mu, sigma, cap) of a lognormal over tokens; cost-model.md §9.2.
LOGNORMAL_LENGTHS: dict[str, tuple[float, float, int]] = {
    "c4": (5.8, 1.0, 2_000_000),
    "github": (6.12, 1.94, 2_000_000),
    "sharegpt": (5.71, 1.0, 2_000_000),
    "longctx": (6.35, 2.33, 2_000_000),
}
LENGTH_KINDS = ("fixed", *LOGNORMAL_LENGTHS, "pystdlib")
FILE = "file"  # documents from a token file (`Workload.tokens`), not a distribution a scenario names


@functools.lru_cache(maxsize=1)
def pystdlib_files() -> tuple[tuple[str, ...], np.ndarray]:
    """Relative paths and byte sizes of this interpreter's standard-library `.py` files, sorted.

    With a byte-level tokenizer a file's size is its length in tokens: a real, heavy-tailed corpus
    that exists on every machine with Python.
    """
    root = sysconfig.get_paths()["stdlib"]
    found: list[tuple[str, int]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "__pycache__"))
        for fn in filenames:
            if fn.endswith(".py"):
                path = os.path.join(dirpath, fn)
                size = os.path.getsize(path)
                if size > 0:
                    found.append((os.path.relpath(path, root), size))
    if not found:
        raise RuntimeError(f"no .py files under the standard library at {root}")
    found.sort()
    return tuple(p for p, _ in found), np.array([s for _, s in found], dtype=np.int64)


@dataclass(frozen=True)
class PackedBatch:
    """One iteration's global batch: `count` micro-batches of `seq_len` tokens each.

    Arrays are per segment (a document piece inside one window): `seg_len`, `seg_window` (its
    micro-batch), `seg_doc` (which drawn document) and `seg_offset` (start inside that document).
    `doc_ids` maps a drawn document to its source id (a file index for `pystdlib`, else -1) and
    `doc_len` gives its full length, so a reader knows whether a segment ends its document.
    """

    seq_len: int
    count: int
    seg_len: np.ndarray
    seg_window: np.ndarray
    seg_doc: np.ndarray
    seg_offset: np.ndarray
    doc_ids: np.ndarray  # for a token file: the document piece's start in the token stream
    doc_len: np.ndarray  # full length of each drawn document (its last segment may end earlier)
    sum_sq: np.ndarray  # (count,) float64: sum of squared segment lengths per micro-batch

    def segments(self, k: int) -> list[tuple[int, int, int]]:
        """(source doc id, offset, length) of every segment of micro-batch k, in order."""
        lo, hi = np.searchsorted(self.seg_window, [k, k + 1])
        return [
            (int(self.doc_ids[self.seg_doc[s]]), int(self.seg_offset[s]), int(self.seg_len[s]))
            for s in range(lo, hi)
        ]

    def lengths(self, k: int) -> list[int]:
        lo, hi = np.searchsorted(self.seg_window, [k, k + 1])
        return [int(x) for x in self.seg_len[lo:hi]]


@dataclass(frozen=True)
class Workload:
    """Tokens per packed micro-batch, micro-batches per replica, and the length distribution."""

    seq_len: int
    num_microbatches: int
    lengths: str = "github"
    seed: int = 0
    doc_len: int | None = None  # only for lengths = "fixed"; default: one document per window
    tokens: TokenFile | None = None  # only for lengths = "file"
    token_origin: tuple[int, int] = (0, 0)  # (iteration, stream token it starts at); file only

    def __post_init__(self) -> None:
        if not isinstance(self.seq_len, int) or self.seq_len < 1:
            raise ValueError(f"parallel.seq_len = {self.seq_len!r}: must be a positive integer")
        if not isinstance(self.num_microbatches, int) or self.num_microbatches < 1:
            raise ValueError(f"parallel.microbatches = {self.num_microbatches!r}: must be a positive integer")
        if self.lengths not in LENGTH_KINDS and self.lengths != FILE:
            raise ValueError(
                f"workload.lengths = {self.lengths!r}: unknown; allowed: {', '.join(LENGTH_KINDS)}"
            )
        if (self.lengths == FILE) != isinstance(self.tokens, TokenFile):
            raise ValueError(f"workload.lengths = {self.lengths!r}: a token file needs lengths = 'file'")
        if self.doc_len is not None and (self.lengths != "fixed" or self.doc_len < 1):
            raise ValueError(
                f"workload.doc_len = {self.doc_len!r}: only a positive integer with lengths = 'fixed'"
            )

    def _draw(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """n document lengths and their source ids."""
        if self.lengths == "fixed":
            return np.full(n, self.doc_len or self.seq_len, dtype=np.int64), np.full(n, -1)
        if self.lengths == "pystdlib":
            _, sizes = pystdlib_files()
            ids = rng.integers(0, len(sizes), size=n)
            return sizes[ids], ids
        mu, sigma, cap = LOGNORMAL_LENGTHS[self.lengths]
        raw = np.ceil(rng.lognormal(mu, sigma, size=n))
        return np.clip(raw, 1, cap).astype(np.int64), np.full(n, -1)

    def token_start(self, iteration: int, count: int) -> int:
        """Stream position of `iteration`'s first token (a token file; `count` = G)."""
        it0, t0 = self.token_origin
        return t0 + (iteration - it0) * count * self.seq_len

    def at_position(self, iteration: int, tokens: int) -> Workload:
        """This workload with `iteration` starting at stream token `tokens` (a resumed run)."""
        return replace(self, token_origin=(iteration, tokens)) if self.tokens is not None else self

    def pack(self, iteration: int, count: int) -> PackedBatch:
        """The `count` micro-batches of `iteration`; the same arguments always give the same batch."""
        total = count * self.seq_len
        if self.tokens is not None:
            doc_ids, doc_len = self.tokens.documents(self.token_start(iteration, count), total)
            return _cut(self.seq_len, count, doc_len, doc_ids)
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, iteration]))
        lens: list[np.ndarray] = []
        ids: list[np.ndarray] = []
        covered = 0
        while covered < total:
            mean = self.doc_len or (self.seq_len if self.lengths == "fixed" else 1000)
            n = int((total - covered) / mean * 1.3) + 16
            length, source = self._draw(rng, n)
            lens.append(length)
            ids.append(source)
            covered += int(length.sum())
        return _cut(self.seq_len, count, np.concatenate(lens), np.concatenate(ids))


def _cut(seq_len: int, count: int, doc_len: np.ndarray, doc_ids: np.ndarray) -> PackedBatch:
    """Documents laid end to end (they cover `count · seq_len` tokens) cut into `count` windows:
    the one packing rule of drawn and file documents."""
    total = count * seq_len
    doc_end = np.cumsum(doc_len)
    ndocs = int(np.searchsorted(doc_end, total)) + 1  # documents needed to cover `total`
    doc_len, doc_ids, doc_end = doc_len[:ndocs], doc_ids[:ndocs], doc_end[:ndocs]
    doc_start = doc_end - doc_len
    cuts = np.union1d(doc_end[doc_end < total], np.arange(0, total + 1, seq_len))
    seg_start = cuts[:-1]
    seg_len = np.diff(cuts)
    seg_window = seg_start // seq_len
    seg_doc = np.searchsorted(doc_end, seg_start, side="right")
    seg_offset = seg_start - doc_start[seg_doc]
    sum_sq = np.bincount(seg_window, weights=seg_len.astype(np.float64) ** 2, minlength=count)
    return PackedBatch(seq_len, count, seg_len, seg_window, seg_doc, seg_offset, doc_ids, doc_len, sum_sq)


def packed(workload: Workload, iteration: int, count: int) -> PackedBatch:
    """`workload.pack(iteration, count)`, memoised: a replan prices every candidate plan on the
    same iteration's batch. The arrays are shared between callers, so they are read-only. A token
    file's batch is keyed by the file's size and modification time too (a rewritten file is
    packed again)."""
    stamp = workload.tokens._key() if workload.tokens is not None else None
    return _packed(workload, iteration, count, stamp)


@functools.lru_cache(maxsize=16)
def _packed(workload: Workload, iteration: int, count: int, stamp) -> PackedBatch:
    batch = workload.pack(iteration, count)
    for a in (batch.seg_len, batch.seg_window, batch.seg_doc, batch.seg_offset, batch.doc_ids,
              batch.doc_len, batch.sum_sq):  # fmt: skip
        a.setflags(write=False)
    return batch
