"""How long a checkpoint blocks the training loop: synchronous write vs `dcp.async_save`.

One member's share of a checkpoint, in one process, exactly as `control/member.py` saves it: the
committed shard copied out of the worker (`holding_of`, a clone of parameters and both AdamW
moments: both modes pay it), then `state.checkpoint.Saver.save` — `mode="sync"` writes the DCP
files and their checksums before returning, `mode="async"` hands the copy to `dcp.async_save` and
returns; its write and checksums finish on a background thread (`Saver.wait`). Reported per mode
(median of `--repeats`): `blocked_s` (copy + the `save` call: what the loop waits for) and
`complete_s` (until the files and checksums are on disk). The model is TP rank 0 of stage 0 of a
tp x pp plan of a LLaMA of the given shape (default ~124M parameters, tp 2 x pp 2: one device
holds a quarter, 3 x 4 bytes per parameter written).

    PYTHONPATH=. python benchmarks/checkpoint_cost.py [--repeats 3] [--json OUT] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time

import torch

from resihp.core.model_spec import ModelSpec
from resihp.core.plan import Plan
from resihp.model import init_tensor, slice_tensor, stage_param_names
from resihp.runtime.state.checkpoint import Saver
from resihp.runtime.state.transfer import Holding


def shard_holding(spec: ModelSpec, plan: Plan, device: int) -> Holding:
    """`device`'s shard under `plan`, with moments (random values of the right shapes)."""
    r, i = plan.stage_of(device)
    st = plan.replicas[r][i]
    rank = st.devices.index(device)
    params = {
        n: slice_tensor(spec, n, init_tensor(spec, n, 0), st.tp_split, st.ffn_split, rank)
        for n in stage_param_names(spec, st.layers)
    }
    moments = ({n: t.clone() for n, t in params.items()}, {n: t.abs() for n, t in params.items()})
    return Holding(params, moments)


def measure(mode: str, spec: ModelSpec, plan: Plan, live: Holding, root: str, it: int) -> dict:
    """One save of device 0's share in `mode`: blocked and complete seconds."""
    saver = Saver(mode)
    t0 = time.perf_counter()
    copy = Holding(  # what `holding_of(worker)` does before every save
        {n: t.detach().clone() for n, t in live.params.items()},
        tuple({n: t.detach().clone() for n, t in m.items()} for m in live.moments),
    )
    t1 = time.perf_counter()
    assert saver.save(root, it, 0, plan, 0, copy)
    t2 = time.perf_counter()
    saver.wait()
    t3 = time.perf_counter()
    return {"copy_s": t1 - t0, "blocked_s": t2 - t0, "complete_s": t3 - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--ffn", type=int, default=3072)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", help="where to write (default: a temporary directory)")
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()
    torch.set_num_threads(1)  # as a member does
    spec = ModelSpec("bench", args.layers, args.hidden, args.heads, args.heads, args.ffn, args.vocab)
    plan = Plan.uniform(spec, args.tp, args.pp, 1, 2)
    live = shard_holding(spec, plan, 0)
    nbytes = 3 * sum(t.numel() * t.element_size() for t in live.params.values())
    root = tempfile.mkdtemp(prefix="ckpt-cost-", dir=args.dir)
    out = {"params": spec.total_params, "device_bytes": nbytes, "tp": args.tp, "pp": args.pp, "modes": {}}
    try:
        runs: dict[str, list[dict]] = {"sync": [], "async": []}
        for k in range(args.repeats):  # interleaved, so that both modes see the same disk state
            for mode in runs:
                runs[mode].append(measure(mode, spec, plan, live, root, 2 * k + (mode == "async")))
                shutil.rmtree(root)
        for mode, rs in runs.items():
            out["modes"][mode] = {key: statistics.median(r[key] for r in rs) for key in rs[0]}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{spec.total_params / 1e6:.0f}M-parameter model, tp {args.tp} x pp {args.pp}: device 0 writes "
          f"{nbytes / 2**20:.0f} MiB (params + AdamW moments), median of {args.repeats}")  # fmt: skip
    for mode, m in out["modes"].items():
        print(f"  {mode:5s}: loop blocked {m['blocked_s']:.3f} s (copy {m['copy_s']:.3f} s), "
              f"on disk after {m['complete_s']:.3f} s")  # fmt: skip
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
