"""The runtime on one device, measured in one command: parity, throughput, attention, cost model,
injected slowness, and (with 2+ GPUs) NCCL recovery.

    PYTHONPATH=. python benchmarks/gpu_check.py --device cuda --json OUT        # <= 8 min, one GPU
    PYTHONPATH=. python benchmarks/gpu_check.py --device cpu --quick --json OUT # <= 2 min

Sections of the JSON (each one has "error" instead when it raised; the others still run):

* `parity`: one member (`exec/solo.py`: the executor of `resihp train` on a one-device plan), fp32,
  20 iterations of the tiny model on the device, against the single-process CPU reference: the
  largest relative difference of the per-iteration losses (target on a GPU: <= 1e-4).
* `throughput`: bf16 training of a Llama of about 1.1 B parameters (16 layers, hidden 2048, GQA
  32 / 8 heads, FFN 8192, vocabulary 32000) on packed windows of 4096 tokens (`github` document
  lengths), 4 micro-batches per iteration, through the executor (instrumentation on) and through a
  plain PyTorch loop over the same model code (`build_stage`), optimizer and micro-batches: tokens/s
  of each, their ratio (target >= 0.95), MFU (model FLOPs of the documents actually attended,
  causal, over the preset's dense bf16 peak), peak memory. `--device cpu --quick`: a tiny model.
* `attention`: forward + backward of one layer's attention core at fixed N for Σl² = N², N²/4,
  N²/16 (`attention_cost.py`).
* `cost_model`: measured forward and backward (B + W) of one LLaMA 2-7B layer (hidden 4096, 32
  heads, FFN 11008) at 4096 tokens, one document, bf16 autocast on fp32 weights (what the executor
  runs), against `build_costs` on the `h200` preset: relative errors (target <= 15 %). On CPU a
  small layer against the `cpu` preset.
* `slow_injection`: the achieved slowdown of F and B at p = 0.5 (target 2), and the no-op W's.
* `timing_overhead`: iteration time of the executor with per-instruction timing on against off,
  every iteration index run both ways by one worker (paired; target <= 3 %): perf_counter on CPU,
  CUDA events on a GPU.
* `nccl_recovery`: with 2 or more GPUs, a job on NCCL with one member stopped: recovery time and
  the losses against the reference; with fewer, why it was skipped.

Only stdlib, torch and numpy; runs from the working tree (`PYTHONPATH=.`).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import traceback

import numpy as np
import torch

from resihp.core.cluster import Cluster
from resihp.core.model_spec import ModelSpec, model_preset
from resihp.core.plan import Plan
from resihp.core.workload import Workload
from resihp.cost.build import build_costs
from resihp.cost.flops import C_ATT_TIME, training_flops_per_token
from resihp.cost.hardware import hardware_preset
from resihp.model import Docs, build_stage, microbatch_loss, rope_tables
from resihp.model.layers import DecoderLayer
from resihp.runtime.config import TrainConfig
from resihp.runtime.exec.data import iteration_microbatches
from resihp.runtime.exec.groups import build_groups
from resihp.runtime.exec.iteration import Hooks
from resihp.runtime.exec.optim import build_optimizer
from resihp.runtime.exec.solo import run_solo
from resihp.runtime.exec.worker import Worker
from resihp.runtime.job import JobSpec, OptimConfig
from resihp.runtime.reference import reference_for

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_cost import measure as attention_measure  # noqa: E402

LLAMA_1B = ModelSpec("llama-1.1b", 16, 2048, 32, 8, 8192, 32000)
TINY_LM = ModelSpec("tiny-lm", 2, 64, 4, 2, 176, 256)


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _backend(device: str) -> str:
    return "nccl" if device == "cuda" else "gloo"


def _peak(device: str):
    """(hardware preset, name of the device) for MFU and the cost model."""
    if device == "cpu":
        return hardware_preset("cpu"), "cpu"
    name = torch.cuda.get_device_name()
    return hardware_preset("h200" if "H200" in name else "h100"), name


# ---------------------------------------------------------------------------------------- parity
def parity(device: str, quick: bool) -> dict:
    iterations = 20
    config = TrainConfig(tp=1, pp=1, dp=1, workers=1, iterations=iterations, device=device)
    plan = config.plan()
    res = run_solo(plan, config.job_spec(plan))
    ref = reference_for(plan, dataclasses.replace(config, device="cpu"))[0]
    diff = max(abs(a - b) / abs(b) for a, b in zip(res.losses, ref))
    return {"model": config.model, "iterations": iterations, "max_rel_loss_diff": diff,
            "first_loss": res.losses[0], "last_loss": res.losses[-1], "target": 1e-4}  # fmt: skip


# ------------------------------------------------------------------------------------ throughput
def _plain_loop(spec, workload, iterations, warmup, dev, optim) -> list[float]:
    """Seconds per iteration of a plain bf16 loop over the same model code, optimizer and batches."""
    model = build_stage(spec, seed=0).to(dev)
    opt = build_optimizer(model.named_parameters(), optim)
    g, n = workload.num_microbatches, workload.seq_len
    times = []
    for it in range(warmup + iterations):
        mbs = iteration_microbatches(workload, it, g)
        _sync(dev)
        t0 = time.perf_counter()
        for mb in mbs:
            docs, targets = Docs.of(mb.segment_ids), mb.num_targets
            ids, tgt, seg, pos = (t.to(dev, non_blocking=True) for t in vars(mb).values())
            with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
                logits = model(ids, seg, pos, docs=docs)
            microbatch_loss(logits, tgt, g, n, targets)[0].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(dev)
        if it >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def throughput(device: str, quick: bool) -> dict:
    spec, n, m = (TINY_LM, 256, 2) if quick else (LLAMA_1B, 4096, 4)
    iterations, warmup = (4, 1) if quick else (5, 2)
    dev = torch.device(device)
    workload = Workload(n, m, "github", 0)
    optim = OptimConfig(lr=1e-4)
    plan = Plan.uniform(spec, 1, 1, 1, m, "1f1b")
    job = JobSpec(spec, workload, optim, device=device, backend=_backend(device), precision="bf16")
    out = {"model": dataclasses.asdict(spec), "params": spec.total_params, "seq_len": n, "microbatches": m}
    rounds = 3 if dev.type == "cpu" else 1  # interleaved on shared CPU cores (the load drifts)
    times: dict[str, list[float]] = {"executor": [], "plain": []}
    peaks: dict[str, int | None] = {}
    for _ in range(rounds):
        for name in ("executor", "plain"):
            gc.collect()  # the previous model's memory, before the next one is built
            if dev.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(dev)
            if name == "executor":
                res = run_solo(plan, job, warmup + iterations)
                times[name] += [r["wall_s"] for r in res.records[warmup:]]
                del res
            else:
                times[name] += _plain_loop(spec, workload, iterations, warmup, dev, optim)
            peaks[name] = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None
    stats = {}
    for name, ts in times.items():
        t = statistics.median(ts)
        stats[name] = {"iteration_s": t, "tokens_per_s": m * n / t, "peak_memory_bytes": peaks[name]}
    out["rounds"] = rounds
    sum_sq = float(np.mean([workload.pack(it, m).sum_sq.mean() for it in range(warmup, warmup + iterations)]))
    flops = training_flops_per_token(spec, n, sum_sq, c_att=C_ATT_TIME)
    hw, gpu = _peak(device)
    for s in stats.values():
        s["mfu"] = s["tokens_per_s"] * flops / hw.peak_flops
    out.update(stats, ratio=stats["executor"]["tokens_per_s"] / stats["plain"]["tokens_per_s"])
    out.update(target_ratio=0.95, flops_per_token=flops, mean_sum_sq=sum_sq)
    out.update(peak_flops=hw.peak_flops, peak_of=hw.name, gpu=gpu)
    return out


# ------------------------------------------------------------------------------------ attention
def attention(device: str, quick: bool) -> dict:
    n = 1024 if quick else 4096
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    heads, head_dim = (8, 64) if quick else (32, 128)
    return attention_measure(n, device, dtype, heads, head_dim, repeats=5 if quick else 10)


# ----------------------------------------------------------------------------------- cost model
def _layer_times(spec: ModelSpec, n: int, dev: torch.device, dtype, repeats: int) -> tuple[float, float]:
    """Median (forward, backward) seconds of one decoder layer on N = n tokens, one document."""
    layer = DecoderLayer(spec, (spec.heads,), (spec.ffn,), 0).to(dev)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.02 if p.ndim > 1 else torch.ones(p.shape))
    x = torch.randn(n, spec.hidden, generator=g).to(dev).requires_grad_()
    cos, sin = (t.to(dev) for t in rope_tables(torch.arange(n), spec.head_dim))
    docs, params = Docs((n,)), list(layer.parameters())
    up = torch.randn(n, spec.hidden, generator=g).to(dev)
    fwd, bwd = [], []
    for r in range(repeats + 1):
        _sync(dev)
        t0 = time.perf_counter()
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            out = layer(x, cos, sin, docs)
        _sync(dev)
        t1 = time.perf_counter()
        torch.autograd.grad(out, [x, *params], up)
        _sync(dev)
        if r:
            fwd.append(t1 - t0)
            bwd.append(time.perf_counter() - t1)
    return statistics.median(fwd), statistics.median(bwd)


def cost_model(device: str, quick: bool) -> dict:
    if device == "cpu":
        spec, n, dtype = ModelSpec("cpu-layer", 3, 256, 4, 4, 704, 256), 512, torch.float32
    else:
        spec, n, dtype = dataclasses.replace(model_preset("llama2-7b"), num_layers=3), 4096, torch.bfloat16
    hw, gpu = _peak(device)
    plan = Plan.uniform(spec, 1, 3, 1, 1)  # stage 1: exactly one layer, no embedding, no head
    costs = build_costs(spec, plan, Cluster(1, 3, hw), np.array([float(n)]), np.array([float(n) ** 2]), hw)
    table = costs.chunk[(0, 1)]
    pred = [float(table[k][0] + table[k][1] * n + table[k][2] * n * n) for k in range(3)]
    f, b = _layer_times(spec, n, torch.device(device), dtype, repeats=3 if quick else 10)
    return {
        "layer": {"hidden": spec.hidden, "heads": spec.heads, "ffn": spec.ffn}, "tokens": n,
        "dtype": str(dtype).removeprefix("torch."), "hardware": hw.name, "gpu": gpu,
        "measured_s": {"F": f, "B+W": b}, "predicted_s": {"F": pred[0], "B+W": pred[1] + pred[2]},
        "rel_error": {"F": pred[0] / f - 1, "B+W": (pred[1] + pred[2]) / b - 1}, "target": 0.15,
    }  # fmt: skip


# ------------------------------------------------------------------------------- slow injection
def slow_injection(device: str, quick: bool) -> dict:
    """One run whose odd iterations compute at p = 0.5: per op, the median over slowed iterations of
    the op's summed compute time over the median over healthy ones (both halves share the load of
    the same minutes); the first two iterations warm up (on CUDA the first slowed one learns t)."""
    spec, n = (
        (TINY_LM, 256) if quick or device == "cpu" else (ModelSpec("mid", 4, 1024, 16, 4, 2816, 32000), 2048)
    )
    iterations = 12 if quick else 16
    plan = Plan.uniform(spec, 1, 1, 1, 2, "1f1b")
    job = JobSpec(spec, Workload(n, 2, "github", 0), device=device, backend=_backend(device),
                  precision="fp32" if device == "cpu" else "bf16")  # fmt: skip
    p = 0.5
    res = run_solo(plan, job, iterations, hooks=Hooks(slow=lambda it: p if it % 2 else 1.0))
    healthy, slowed = res.records[2::2], res.records[3::2]

    def med(recs, op):
        return statistics.median(sum(r.compute_s for r in rec["instrs"] if r.op == op) for rec in recs)

    out = {"p": p, "target_slowdown": 1 / p, "iterations": iterations}
    for op in ("F", "B", "W"):
        h, s_ = med(healthy, op), med(slowed, op)
        out[op] = {"healthy_s": h, "slow_s": s_, "slowdown": s_ / h if h > 0 else None}
    out["wall_slowdown"] = statistics.median(r["wall_s"] for r in slowed) / statistics.median(
        r["wall_s"] for r in healthy
    )
    if device == "cpu":  # busy-wait: the process computes the delay
        out["cpu_slowdown"] = statistics.median(r["cpu_s"] for r in slowed) / statistics.median(
            r["cpu_s"] for r in healthy
        )
    return out


# ------------------------------------------------------------------------------ timing overhead
def timing_overhead(device: str, quick: bool) -> dict:
    """One worker runs every iteration index twice, timing on and off in alternating order (the
    clock's switch), so each pair shares the load of the moment: the median of the paired wall
    ratios, and the medians themselves."""
    spec, n = (
        (model_preset("tiny"), 128)
        if device == "cpu"
        else (ModelSpec("mid", 4, 1024, 16, 4, 2816, 32000), 2048)
    )
    plan = Plan.uniform(spec, 1, 1, 1, 4, "1f1b")
    job = JobSpec(spec, Workload(n, 4, "pystdlib", 0), device=device, backend=_backend(device),
                  precision="fp32" if device == "cpu" else "bf16")  # fmt: skip
    worker = Worker(plan, 0, build_groups(plan, 0), job)
    pairs = 20 if quick else 40
    walls: dict[bool, list[float]] = {True: [], False: []}
    ratios = []
    for it in range(pairs + 2):
        got = {}
        for timing in (it % 2 == 0, it % 2 == 1):
            worker.clock.enabled = timing
            got[timing] = worker.run_iteration(it)["wall_s"]
        if it >= 2:  # warm-up
            ratios.append(got[True] / got[False])
            for timing, wall in got.items():
                walls[timing].append(wall)
    medians = {"timing_on": statistics.median(walls[True]), "timing_off": statistics.median(walls[False])}
    return {
        "model": spec.name, "seq_len": n, "pairs": pairs, "overhead": statistics.median(ratios) - 1,
        "iteration_s": medians, "target": 0.03,
    }  # fmt: skip


# ------------------------------------------------------------------------------- NCCL recovery
def nccl_recovery(device: str, quick: bool) -> dict:
    gpus = torch.cuda.device_count() if device == "cuda" and torch.cuda.is_available() else 0
    if gpus < 2:
        why = "a CPU run" if device == "cpu" else f"needs 2 or more GPUs; this machine has {gpus}"
        return {"skipped": why}
    tp, pp, dp = (2, 2, 2) if gpus >= 8 else (1, 2, 2) if gpus >= 4 else (1, 1, 2)
    with tempfile.TemporaryDirectory() as tmp:
        faults = os.path.join(tmp, "faults.toml")
        with open(faults, "w") as f:
            f.write(f"[[faults]]\nkind = 'stop'\ndevice = {tp * pp * dp - 1}\nat_iter = 4\n")
        config = TrainConfig(tp=tp, pp=pp, dp=dp, workers=tp * pp * dp, iterations=10, device="cuda",
                             faults=faults, detect_slow=False)  # fmt: skip
        from resihp.runtime.train import run_training

        res = run_training(config, progress=False)
    ref = reference_for(config.plan(), dataclasses.replace(config, device="cpu"))[0]
    losses = [r["loss"] for r in res["iterations"]]
    stop = next(e for e in res["events"] if e["kind"] == "fail-stop")
    return {"layout": [tp, pp, dp], "gpus": gpus, "recovery": stop.get("recovery"),
            "max_rel_loss_diff": max(abs(a - b) / b for a, b in zip(losses, ref))}  # fmt: skip


SECTIONS = {
    "parity": parity,
    "throughput": throughput,
    "attention": attention,
    "cost_model": cost_model,
    "slow_injection": slow_injection,
    "timing_overhead": timing_overhead,
    "nccl_recovery": nccl_recovery,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    ap.add_argument("--quick", action="store_true", help="small sizes (the CPU smoke run)")
    ap.add_argument("--only", nargs="*", choices=list(SECTIONS), help="run these sections only")
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device")
    if args.device == "cpu":
        torch.set_num_threads(
            1
        )  # steady timings on shared cores (a busy-wait next to idle OpenMP spinners is not)
    t_start = time.perf_counter()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    out = {"device": args.device, "quick": args.quick, "torch": torch.__version__, "gpus": gpus}
    out["python"] = sys.version.split()[0]
    for name, fn in SECTIONS.items():
        if args.only and name not in args.only:
            continue
        t0 = time.perf_counter()
        try:
            out[name] = fn(args.device, args.quick)
        except Exception as exc:  # a section's failure is a result too; the others still run
            out[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
        out[name]["elapsed_s"] = time.perf_counter() - t0
        print(f"{name}: {json.dumps(out[name], default=str)[:600]}", flush=True)
        if args.json_out:  # written after every section: a run cut short keeps what it measured
            with open(args.json_out, "w") as f:
                json.dump(out, f, indent=1, default=str)
    out["elapsed_s"] = time.perf_counter() - t_start
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(out, f, indent=1, default=str)
    print(f"total {out['elapsed_s']:.1f} s")


if __name__ == "__main__":
    main()
