"""Attention cost against the packed documents: forward + backward of one layer's attention core.

At fixed N the window holds 1, 4 or 16 equal documents, so Σl² = N², N²/4, N²/16; the time of the
model's attention (`resihp.model.attention`: one causal attention per document, the fused varlen
kernel on CUDA in bf16) should fall with Σl², and the dense masked path (the tests' oracle, what the
runtime ran before) should not. Median of `--repeats` runs after one warm-up, q, k, v of `--heads`
heads of `--head-dim` (the attention of a layer with hidden = heads x head_dim).

    PYTHONPATH=. python benchmarks/attention_cost.py --device cpu --seq-len 2048 --json OUT

writes {"seq_len": 2048, "time_s": {"1": ..., "4": ..., "16": ...}, "dense_time_s": {...}, ...},
keyed by N² / Σl².
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from resihp.model import Docs, attention, segment_mask
from resihp.model.attention import attention_path

RATIOS = (1, 4, 16)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fwd_bwd_s(
    n: int, docs: int, heads: int, head_dim: int, device, dtype, repeats: int, dense: bool
) -> float:
    """Median seconds of forward + backward of the attention of `docs` equal documents in N = `n`."""
    device = torch.device(device)
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(heads, n, head_dim, generator=g).to(device, dtype).requires_grad_() for _ in range(3)
    )
    up = torch.randn(heads, n, head_dim, generator=g).to(device, dtype)
    lens = (n // docs,) * docs
    layout = Docs(lens)
    if dense:
        seg = torch.arange(docs).repeat_interleave(n // docs)
        layout = segment_mask(seg.to(device))
    times = []
    for r in range(repeats + 1):
        _sync(device)
        t0 = time.perf_counter()
        out = attention(q, k, v, layout)
        torch.autograd.grad(out, (q, k, v), up)
        _sync(device)
        if r:  # the first run warms up
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(n: int, device: str, dtype: torch.dtype, heads: int, head_dim: int, repeats: int) -> dict:
    """{"seq_len", "path", "time_s": {ratio: s}, "dense_time_s": {ratio: s}} at N = `n`."""
    probe = torch.zeros(1, n, 1, device=device, dtype=dtype)
    out = {
        "seq_len": n,
        "device": device,
        "dtype": str(dtype).removeprefix("torch."),
        "heads": heads,
        "head_dim": head_dim,
        "repeats": repeats,
        "path": {str(r): attention_path(probe, Docs((n // r,) * r)) for r in RATIOS},
        "time_s": {},
        "dense_time_s": {},
    }
    for r in RATIOS:
        out["time_s"][str(r)] = fwd_bwd_s(n, r, heads, head_dim, device, dtype, repeats, dense=False)
        out["dense_time_s"][str(r)] = fwd_bwd_s(n, r, heads, head_dim, device, dtype, repeats, dense=True)
    out["ratio_16_over_1"] = out["time_s"]["16"] / out["time_s"]["1"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument(
        "--dtype", default=None, choices=["fp32", "bf16"], help="default: fp32 on cpu, bf16 on cuda"
    )
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (1: steady on shared cores)")
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()
    if args.seq_len % 16:
        ap.error(f"--seq-len {args.seq_len}: must be a multiple of 16 (sixteen equal documents)")
    torch.set_num_threads(args.threads)
    name = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    dtype = torch.bfloat16 if name == "bf16" else torch.float32
    out = measure(args.seq_len, args.device, dtype, args.heads, args.head_dim, args.repeats)
    for r in RATIOS:
        key = str(r)
        print(
            f"N^2/sum l^2 = {r:2d} ({out['path'][key]}): {out['time_s'][key] * 1e3:8.2f} ms   "
            f"dense mask: {out['dense_time_s'][key] * 1e3:8.2f} ms"
        )
    print(f"time at 16 / time at 1 = {out['ratio_16_over_1']:.3f}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
