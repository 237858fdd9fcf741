"""`resihp train [--config FILE] [--faults FILE] [--resume DIR] [--json OUT]`: train on CPU workers.

With no arguments: the embedded default, a tiny LLaMA on the Python standard-library corpus with
8 workers at (TP 2, PP 2, DP 2), live progress on the terminal (architecture §5.5).
"""

from __future__ import annotations

import json

from .common import table


def add_parser(sub) -> None:
    p = sub.add_parser(
        "train", help="train a tiny LLaMA on local workers (CPU gloo; CUDA NCCL with [run] device)"
    )
    p.add_argument("--config", help="training config TOML ([model] [parallel] [workload] [optim] [run])")
    p.add_argument("--iterations", type=int, help="override run.iterations")
    p.add_argument("--faults", help="faults TOML ([[faults]] stop/slow/link keyed by at_iter) to inject")
    p.add_argument("--checkpoint-every", type=int, help="override run.checkpoint_every (0: off)")
    p.add_argument("--checkpoint-dir", help="override run.checkpoint_dir")
    p.add_argument("--resume", metavar="DIR", help="restart the job from a checkpoint (DIR or DIR/latest)")
    p.add_argument("--json", dest="json_out", help="write per-iteration loss, time, samples, events")
    p.add_argument("--trace", help="write per-device, per-instruction timings as JSON lines")
    p.add_argument("--quiet", action="store_true", help="no live progress")
    p.set_defaults(run=run)


def run(args) -> int:
    from dataclasses import replace

    from resihp.core.files import check_dir, check_input, check_outputs, read_toml, write_atomic
    from resihp.runtime.state.dirlock import check_free

    # Every input is checked before the runtime loads and before any process starts: the flags
    # first, under the names the user typed, then the config and the whole run (`check_run`).
    check_outputs({"--json": args.json_out, "--trace": args.trace})
    if args.faults:
        check_input(args.faults, "--faults")
    if args.checkpoint_dir:
        check_dir(args.checkpoint_dir, "--checkpoint-dir")
        check_free(args.checkpoint_dir, "--checkpoint-dir")
    raw = read_toml(args.config, "--config") if args.config else {}
    from resihp.runtime.config import TrainConfig, check_run

    config = TrainConfig.from_dict(raw)
    if args.iterations is not None:
        config = replace(config, iterations=args.iterations)
    if args.trace:
        config = replace(config, trace=args.trace)
    if args.faults:
        config = replace(config, faults=args.faults)
    if args.checkpoint_dir:
        config = replace(config, checkpoint_dir=args.checkpoint_dir)
    if args.checkpoint_every is not None:
        config = replace(config, checkpoint_every=args.checkpoint_every)
    plan = config.plan()
    if args.resume is None:  # with --resume, run_training checks against the checkpoint's iteration
        check_run(config, plan)
    from resihp.runtime.train import run_training  # torch loads here

    stages = "; ".join(
        f"r{d}s{i}: dev {list(st.devices)} layers {st.layers[0]}-{st.layers[1] - 1}"
        for d, r in enumerate(plan.replicas) for i, st in enumerate(r)
    )  # fmt: skip
    where = f"{config.workers} {config.device.upper()} workers"
    print(f"resihp train: {config.model} on {where}, tp {config.tp} pp {config.pp} "
          f"dp {config.dp}, {config.schedule}, {config.iterations} iterations")  # fmt: skip
    print(f"  plan: {stages}")
    result = run_training(config, progress=not args.quiet, resume=args.resume)
    s = result["summary"]
    rows = [[r["iter"], f"{r['loss']:.4f}", f"{r['time_s']:.3f}"] for r in result["iterations"]]
    every = max(1, len(rows) // 10)
    print(table(rows[::every] + ([rows[-1]] if (len(rows) - 1) % every else []), ["iter", "loss", "time_s"]))
    print(f"loss {s['first_loss']:.3f} -> {s['final_loss']:.3f}; {s['samples_per_s']:.1f} samples/s, "
          f"{s['tokens_per_s']:.0f} tokens/s; wall {s['wall_s']:.1f} s")  # fmt: skip
    if args.json_out:
        out = {k: v for k, v in result.items() if k not in ("state", "worker_pids")}
        write_atomic(args.json_out, json.dumps(out))
        print(f"results written to {args.json_out}")
    return 0
