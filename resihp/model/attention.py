"""Causal attention inside each packed document: cost ∝ Σl², the same value as a dense N x N mask.

A window of N tokens holds whole or cut documents, each contiguous (the packer's invariant;
`core.workload`). Its attention is one causal attention per document (`Docs` holds their lengths,
read on the host so that choosing kernels never waits for the device). Paths (`attention_path`):

* "causal": one document — SDPA with `is_causal`;
* "varlen": CUDA in bf16 / fp16 — the fused flash kernel over all documents at once
  (`torch.nn.attention.varlen.varlen_attn`, torch >= 2.10);
* "per-doc": elsewhere (CPU, and fp32 on CUDA: flash kernels take no fp32) — documents grouped into
  buckets of equal padded length (the next power of two), each bucket one batched causal SDPA. A
  document padded at its end is exact under the causal mask: no real query sees a later position,
  so padding is never attended and gets no gradient; padded rows are dropped. Padding at most
  doubles a document's length (4x its area); a bucket with one document is not padded. One call
  per bucket, not per document: 16 documents of 128 tokens cost 67 ms against 145 ms as 16 calls
  (fwd + bwd, 8 heads x 64, one CPU thread);
* "dense": a boolean (N, N) mask instead of `Docs` (`layers.segment_mask`): the tests' oracle.

Every SDPA call is 4-D, (batch, H, l, hd): the fused kernels (flash, also on CPU) take only 4-D
inputs; 3-D ones fall back to the math kernel (2.8x slower fwd + bwd at N = 2048 on CPU, O(N²)
memory).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Docs:
    """The documents of a packed window: consecutive segments of `lens` tokens (sum N)."""

    lens: tuple[int, ...]
    _cache: dict = field(default_factory=dict, compare=False, repr=False)  # (what, device) -> tensors

    @staticmethod
    def of(segment_ids: torch.Tensor) -> Docs:
        """From segment ids whose equal values are contiguous (a device tensor costs one host sync)."""
        _, counts = torch.unique_consecutive(segment_ids.cpu(), return_counts=True)
        return Docs(tuple(counts.tolist()))

    def spans(self) -> list[tuple[int, int]]:
        out, lo = [], 0
        for n in self.lens:
            out.append((lo, lo + n))
            lo += n
        return out

    def cu(self, device: torch.device) -> torch.Tensor:
        """(D + 1,) int32 cumulative lengths on `device` (varlen kernels), built once per device."""
        key = ("cu", device)
        if key not in self._cache:
            bounds = [0] + [b for _, b in self.spans()]
            self._cache[key] = torch.tensor(bounds, dtype=torch.int32, device=device)
        return self._cache[key]

    def buckets(self) -> list[tuple[int, list[tuple[int, int]]]]:
        """(padded length, spans) per bucket: documents by next power of two, in length order."""
        groups: dict[int, list[tuple[int, int]]] = {}
        for a, b in self.spans():
            groups.setdefault(1 << (b - a - 1).bit_length(), []).append((a, b))
        return sorted(groups.items())

    def gather_plan(self, device: torch.device) -> tuple[list, torch.Tensor]:
        """Per bucket (padded length L, spans, gather index (D_b·L,) into the window with N = a zero
        row, or None for a lone document, kept rows (n_b,)), and the permutation that puts the
        buckets' rows back in window order; built once per device."""
        key = ("plan", device)
        if key not in self._cache:
            n, plan, order = sum(self.lens), [], []
            for length, spans in self.buckets():
                if len(spans) == 1:
                    plan.append((length, spans, None, None))
                    order += list(range(*spans[0]))
                    continue
                index, keep = [], []
                for d, (a, b) in enumerate(spans):
                    index += list(range(a, b)) + [n] * (length - (b - a))
                    keep += range(d * length, d * length + b - a)
                    order += list(range(a, b))
                as_tensor = functools.partial(torch.tensor, dtype=torch.long, device=device)
                plan.append((length, spans, as_tensor(index), as_tensor(keep)))
            inverse = torch.empty(n, dtype=torch.long)
            inverse[torch.tensor(order)] = torch.arange(n)
            self._cache[key] = (plan, inverse.to(device))
        return self._cache[key]


@functools.cache
def _varlen() -> Callable | None:
    """`torch.nn.attention.varlen.varlen_attn` as f(q, k, v, cu, max_len) -> (T, H, hd), causal; None
    where torch has none. Its causal flag moved: `is_causal=True` (torch 2.10) became
    `window_size=(-1, 0)` (2.12); both are recognised by the signature."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    if "is_causal" in params:
        return lambda q, k, v, cu, m: varlen_attn(q, k, v, cu, cu, m, m, is_causal=True)
    if "window_size" in params:
        return lambda q, k, v, cu, m: varlen_attn(q, k, v, cu, cu, m, m, window_size=(-1, 0))
    return None


def attention_path(q: torch.Tensor, docs: Docs | torch.Tensor) -> str:
    """Which path `attention` runs for queries like `q` (module doc)."""
    if isinstance(docs, torch.Tensor):
        return "dense"
    if len(docs.lens) == 1:
        return "causal"
    if q.is_cuda and q.dtype in (torch.bfloat16, torch.float16) and _varlen() is not None:
        return "varlen"
    return "per-doc"


def _causal(q, k, v) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _per_doc(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs: Docs) -> torch.Tensor:
    """The bucketed path: q, k, v (H, N, hd) -> (H, N, hd)."""
    h, _, hd = q.shape
    plan, inverse = docs.gather_plan(q.device)
    padded = None
    parts = []
    for length, spans, index, keep in plan:
        if index is None:  # a lone document: its slice, unpadded
            a, b = spans[0]
            parts.append(_causal(q[None, :, a:b], k[None, :, a:b], v[None, :, a:b])[0])  # (H, l, hd)
            continue
        if padded is None:  # one zero row at N: the padding's source
            padded = [torch.cat([x, x.new_zeros(h, 1, hd)], dim=1) for x in (q, k, v)]  # (H, N + 1, hd)
        qb, kb, vb = (
            x.index_select(1, index).view(h, len(spans), length, hd).transpose(0, 1) for x in padded
        )
        out = _causal(qb, kb, vb)  # (D_b, H, L, hd)
        parts.append(out.transpose(0, 1).reshape(h, -1, hd).index_select(1, keep))  # (H, n_b, hd)
    return torch.cat(parts, dim=1).index_select(1, inverse)  # (H, N, hd), window order


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs: Docs | torch.Tensor) -> torch.Tensor:
    """Causal attention inside each document: q, k, v (H, N, hd) -> (H, N, hd). `docs` a boolean
    (N, N) mask (`layers.segment_mask`) runs the dense masked path, the tests' oracle."""
    path = attention_path(q, docs)
    if path == "dense":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=docs)
    if path == "causal":
        return _causal(q[None], k[None], v[None])[0]
    if path == "varlen":
        t = [x.transpose(0, 1).contiguous() for x in (q, k, v)]  # (N, H, hd) each
        out = _varlen()(*t, docs.cu(q.device), max(docs.lens))  # (N, H, hd)
        return out.transpose(0, 1)  # (H, N, hd)
    return _per_doc(q, k, v, docs)
