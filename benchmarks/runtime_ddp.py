"""Tokens/s of the resihp executor at tp 1 / pp 1 / dp 2 vs torch DistributedDataParallel, and the
cost of the executor's per-instruction timing (timing on vs off).

Same model (`--model` preset, seed 0), same micro-batches (`Workload.pack`; replica d runs global
micro-batches mb_offset(d) + j), same loss convention and AdamW, gloo on CPU, one thread per rank.

Per iteration we record the slowest rank's wall time and its process CPU time (CPU time is robust
to other load on a shared machine; wall time is what throughput means). Per variant: the median
over `--rounds` interleaved rounds of each run's median steady iteration (the first `--warmup`
iterations of a run are dropped), and the minimum iteration time seen. The instrumentation cost is
measured twice: across whole runs (noisy under load) and in one process that alternates timing on
and off every iteration of the same worker (tp = pp = dp = 1).

    .venv/bin/python benchmarks/runtime_ddp.py [--iterations 20] [--rounds 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from resihp.model import build_stage
from resihp.model.loss import microbatch_loss
from resihp.runtime.config import TrainConfig
from resihp.runtime.exec.data import build_microbatch
from resihp.runtime.exec.optim import build_optimizer
from resihp.runtime.train import run_training

Times = list[tuple[float, float]]  # per iteration: (wall_s, cpu_s) of the slowest rank


def _ddp_worker(rank: int, port: int, cfg: TrainConfig, out) -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    model = build_stage(cfg.spec, seed=cfg.seed)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = build_optimizer(model.named_parameters(), cfg.optim())
    wl, g = cfg.workload(), 2 * cfg.microbatches
    times = []
    for it in range(cfg.iterations):
        t0, c0 = time.perf_counter(), time.process_time()
        batch = wl.pack(it, g)
        for j in range(cfg.microbatches):
            mb = build_microbatch(wl, batch, rank * cfg.microbatches + j, it)
            last = j == cfg.microbatches - 1
            with ddp.no_sync() if not last else torch.enable_grad():
                logits = ddp(mb.input_ids, mb.segment_ids, mb.positions)
                loss, _ = microbatch_loss(logits, mb.target_ids, g, wl.seq_len)
                # DDP averages over ranks; the loss convention sums micro-batch gradients.
                (loss * 2).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append((time.perf_counter() - t0, time.process_time() - c0))
    out.put((rank, times))
    dist.destroy_process_group()


def run_ddp(cfg: TrainConfig) -> Times:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_ddp_worker, args=(r, store.port, cfg, out)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=600) for _ in procs)
    for p in procs:
        p.join()
    return [max(a, b) for a, b in zip(got[0], got[1])]


def run_ours(cfg: TrainConfig) -> Times:
    res = run_training(cfg, progress=False)
    return [
        (max(r["wall_s"] for r in recs), max(r["cpu_s"] for r in recs))
        for recs in ([r for r in res["trace"] if r["iter"] == it] for it in range(cfg.iterations))
    ]


def overhead_in_process(cfg: TrainConfig, iterations: int) -> dict:
    """Timing on vs off on one Worker in a 1-rank world: every iteration index runs twice, once per
    mode (same data, same cost; the order alternates), and the paired ratios are summarised."""
    from resihp.core.plan import Plan
    from resihp.runtime import JobSpec
    from resihp.runtime.exec.groups import build_groups
    from resihp.runtime.exec.worker import Worker

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    dist.init_process_group("gloo", store=dist.PrefixStore("gen0", store), rank=0, world_size=1)
    plan = Plan.uniform(cfg.spec, 1, 1, 1, cfg.microbatches, cfg.schedule)
    job = JobSpec(cfg.spec, cfg.workload(), cfg.optim(), cfg.seed, iterations)
    groups = build_groups(plan, 0)
    worker = Worker(plan, 0, groups, job)
    times: dict[bool, Times] = {True: [], False: []}
    for it in range(iterations):
        for on in (True, False) if it % 2 == 0 else (False, True):
            worker.clock.enabled = on
            rec = worker.run_iteration(it)
            times[on].append((rec["wall_s"], rec["cpu_s"]))
    groups.destroy()
    dist.destroy_process_group()
    pairs = list(zip(times[True], times[False]))[2:]
    return {
        "iterations": len(pairs),
        "instructions_per_iteration": len(worker.instrs),
        "timing_on": _stats(times[True][2:]),
        "timing_off": _stats(times[False][2:]),
        "overhead_wall_median_of_pairs": statistics.median(a[0] / b[0] - 1 for a, b in pairs),
        "overhead_cpu_median_of_pairs": statistics.median(a[1] / b[1] - 1 for a, b in pairs),
    }


def _stats(times: Times) -> dict:
    return {
        "median_wall_s": statistics.median(w for w, _ in times),
        "min_wall_s": min(w for w, _ in times),
        "median_cpu_s": statistics.median(c for _, c in times),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--json")
    args = ap.parse_args()
    base = dict(model=args.model, tp=1, pp=1, dp=2, workers=2, iterations=args.iterations)
    base.update(microbatches=args.microbatches, seq_len=args.seq_len)
    tokens = 2 * args.microbatches * args.seq_len
    runners = {
        "resihp (timing on)": lambda: run_ours(TrainConfig(**base, timing=True)),
        "resihp (timing off)": lambda: run_ours(TrainConfig(**base, timing=False)),
        "torch DDP": lambda: run_ddp(TrainConfig(**base)),
    }
    # Interleave the variants round by round so that load from other processes hits all of them.
    runs: dict[str, list[dict]] = {name: [] for name in runners}
    for r in range(args.rounds):
        for name, runner in runners.items():
            st = _stats(runner()[args.warmup :])
            runs[name].append(st)
            print(f"round {r}  {name:20s} " + "  ".join(f"{k} {v * 1e3:7.1f} ms" for k, v in st.items()))
    rows = {}
    for name, sts in runs.items():
        wall = statistics.median(s["median_wall_s"] for s in sts)
        cpu = statistics.median(s["median_cpu_s"] for s in sts)
        best = min(s["min_wall_s"] for s in sts)
        rows[name] = {
            "median_wall_s": wall,
            "min_wall_s": best,
            "median_cpu_s": cpu,
            "tokens_per_s": tokens / wall,
            "tokens_per_s_best": tokens / best,
            "runs": sts,
        }
        print(
            f"{name:20s} {tokens / wall:8.0f} tokens/s (median)  {tokens / best:8.0f} tokens/s (best)"
            f"  cpu {cpu * 1e3:6.1f} ms/iter"
        )
    single = overhead_in_process(TrainConfig(**base), 4 * args.iterations)
    print(
        "timing overhead in one process, alternating: "
        + "  ".join(f"{k} {single[k] * 100:+.1f}%" for k in single if k.startswith("overhead"))
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"config": base, "tokens_per_iteration": tokens, "rows": rows, "overhead": single},
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
