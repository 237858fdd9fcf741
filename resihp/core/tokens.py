"""A tokenized dataset on disk: one flat array of token ids (nanoGPT / Megatron `.bin` style),
documents ended by `eos_id`, read through a memory map (never loaded whole).

The file is read as an endless stream that repeats it (epoch e holds file token p at stream
position e·L + p, L its length): the packer asks for the documents overlapping a stream range
(`documents`) and the data loader for their tokens (`read`). A document is a run of tokens up to
and including its `eos_id`; the file's end also ends one, so no document spans two epochs. The
document index (eos positions) and the largest id are found in one chunked pass the first time
a process asks, and kept per (path, size, modification time).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import numpy as np

DTYPES = {"uint16": "<u2", "uint32": "<u4"}
_CHUNK = 1 << 24  # tokens per step of the indexing pass


@functools.lru_cache(maxsize=8)
def _open(path: str, dtype: str, size: int, mtime_ns: int) -> np.memmap:
    return np.memmap(path, dtype=DTYPES[dtype], mode="r")


@functools.lru_cache(maxsize=8)
def _index(path: str, dtype: str, eos_id: int, size: int, mtime_ns: int) -> tuple[np.ndarray, int]:
    """(exclusive ends of every document, ascending, the last = L; largest token id)."""
    tokens = _open(path, dtype, size, mtime_ns)
    ends, top = [], 0
    for lo in range(0, len(tokens), _CHUNK):
        chunk = np.asarray(tokens[lo : lo + _CHUNK])
        ends.append(np.flatnonzero(chunk == eos_id) + lo + 1)
        top = max(top, int(chunk.max()))
    end = np.concatenate(ends) if ends else np.zeros(0, dtype=np.int64)
    if not len(end) or end[-1] != len(tokens):
        end = np.append(end, len(tokens))
    return end.astype(np.int64), top


@dataclass(frozen=True)
class TokenFile:
    """`path`: little-endian `dtype` token ids; `eos_id` ends a document. Picklable: a worker
    process opens its own memory map on first use."""

    path: str
    dtype: str = "uint16"
    eos_id: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path:
            raise ValueError(f"data.path = {self.path!r}: must be a file path")
        if self.dtype not in DTYPES:
            raise ValueError(f"data.dtype = {self.dtype!r}: allowed: {', '.join(DTYPES)}")
        top = np.iinfo(DTYPES[self.dtype]).max
        v = self.eos_id
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= top:
            raise ValueError(f"data.eos_id = {v!r}: must be a token id in [0, {top}] ({self.dtype})")

    def _key(self) -> tuple[str, str, int, int]:
        st = os.stat(self.path)
        return self.path, self.dtype, st.st_size, st.st_mtime_ns

    @property
    def tokens(self) -> np.memmap:
        return _open(*self._key())

    def __len__(self) -> int:
        return len(self.tokens)

    def index(self) -> tuple[np.ndarray, int]:
        """(document ends within the file, exclusive and ascending; the largest token id)."""
        path, dtype, size, mtime = self._key()
        return _index(path, dtype, self.eos_id, size, mtime)

    def check(self, vocab: int, what: str = "data.path") -> None:
        """ValueError unless the file is a non-empty whole number of tokens, all below `vocab`."""
        if not os.path.isfile(self.path):
            raise ValueError(f"{what} {self.path}: no such file")
        size, item = os.path.getsize(self.path), np.dtype(DTYPES[self.dtype]).itemsize
        if size == 0 or size % item:
            raise ValueError(
                f"{what} {self.path}: {size} bytes is not a non-empty whole number of {self.dtype} tokens"
            )
        _, top = self.index()
        if top >= vocab or self.eos_id >= vocab:
            raise ValueError(
                f"{what} {self.path}: token id {max(top, self.eos_id)} (data.dtype {self.dtype}, eos_id "
                f"{self.eos_id}) is outside the model's vocabulary of {vocab}"
            )

    def documents(self, start: int, total: int) -> tuple[np.ndarray, np.ndarray]:
        """(stream start, length to its document's end) of each document piece overlapping the
        stream range [start, start + total), in order; the first may start inside a document, the
        last end after the range."""
        ends, _ = self.index()
        n = int(ends[-1])
        starts, lengths = [], []
        pos, stop = start, start + total
        while pos < stop:
            epoch, p = divmod(pos, n)
            i = int(np.searchsorted(ends, p, side="right"))  # the document holding file token p
            j = int(np.searchsorted(ends, min(n, p + (stop - pos)), side="left")) + 1
            doc_end = ends[i:j]  # this epoch's documents overlapping the range, from the one at p
            doc_start = np.concatenate(([p], doc_end[:-1]))
            starts.append(doc_start + epoch * n)
            lengths.append(doc_end - doc_start)
            pos = epoch * n + int(doc_end[-1])
        return np.concatenate(starts), np.concatenate(lengths)

    def read(self, start: int, count: int) -> np.ndarray:
        """`count` tokens (int64) from stream position `start`, inside one epoch."""
        epoch, p = divmod(start, len(self))
        assert p + count <= len(self), (start, count, len(self))
        return np.asarray(self.tokens[p : p + count], dtype=np.int64)
