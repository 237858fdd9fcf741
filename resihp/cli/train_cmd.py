"""`resihp train [--config FILE] [--faults FILE] [--resume DIR] [--json OUT]`: train on CPU workers.

With no arguments: the embedded default, a tiny LLaMA on the Python standard-library corpus with
8 workers at (TP 2, PP 2, DP 2), live progress and events on the terminal (architecture §5.5);
the summary on stdout counts the events and states the final layout.

A job that stops early still writes its `--json` (and `--trace`): every committed iteration and
every event, the stop the last one. It then prints one line on stderr — what happened, what was
kept, what to do — and exits 2 when it failed, 130 on SIGINT, 143 on SIGTERM.
"""

from __future__ import annotations

import itertools
import json
import signal
import sys
from collections import Counter

from resihp.core.run_events import device_count, layout

from .common import table


def add_parser(sub) -> None:
    p = sub.add_parser(
        "train", help="train a tiny LLaMA on local workers (CPU gloo; CUDA NCCL with [run] device)"
    )
    add_options(p)
    p.set_defaults(run=run)


def add_options(p) -> None:
    """The options of a run (`resihp train`, `resihp controller`)."""
    p.add_argument("--config", help="training config TOML ([model] [parallel] [workload] [optim] [run])")
    p.add_argument("--iterations", type=int, help="override run.iterations")
    p.add_argument("--faults", help="faults TOML ([[faults]] stop/slow/link keyed by at_iter) to inject")
    p.add_argument("--checkpoint-every", type=int, help="override run.checkpoint_every (0: off)")
    p.add_argument("--checkpoint-dir", help="override run.checkpoint_dir")
    p.add_argument("--resume", metavar="DIR", help="restart the job from a checkpoint (DIR or DIR/latest)")
    p.add_argument("--json", dest="json_out", help="write per-iteration loss, time, samples, events")
    p.add_argument("--trace", help="write per-device, per-instruction timings as JSON lines")
    p.add_argument("--quiet", action="store_true", help="no live progress or events on stderr")


def run(args, listen: tuple[str, int] | None = None) -> int:
    """`listen`: `resihp controller`'s address (its agents register there; `run.nodes` needed)."""
    from dataclasses import replace

    from resihp.core.files import check_dir, check_input, check_outputs, read_toml
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
    from resihp.runtime.checks import check_run
    from resihp.runtime.config import TrainConfig

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
    if listen is not None and config.nodes is None:
        raise ValueError("run.nodes is not set: `resihp controller` needs it (with run.devices_per_node)")
    plan = config.plan()
    if args.resume is None:  # with --resume, run_training checks against the checkpoint's iteration
        check_run(config, plan)
    from resihp.runtime.train import run_training  # torch loads here

    stages = "; ".join(
        f"r{d}s{i}: dev {list(st.devices)} layers {st.layers[0]}-{st.layers[1] - 1}"
        for d, r in enumerate(plan.replicas) for i, st in enumerate(r)
    )  # fmt: skip
    model = config.model if config.hf is None else f"{config.spec.name} (model.hf {config.hf})"
    where = f"{config.workers} {config.device.upper()} workers"
    print(f"resihp train: {model} on {where}, tp {config.tp} pp {config.pp} "
          f"dp {config.dp}, {config.schedule}, {config.iterations} iterations")  # fmt: skip
    print(f"  plan: {stages}")
    weights = config.weights_dir()
    data = config.data_path or f"workload.lengths = {config.lengths}"
    print(f"  weights: {weights or f'random (run.seed {config.seed})'}; data: {data}")
    from resihp.runtime.job import Interrupted, WorkerFailed

    trace_as = "file" if args.json_out else "none"  # `--json` streams the trace from its file
    try:
        result = run_training(
            config, progress=not args.quiet, resume=args.resume, listen=listen, trace_as=trace_as
        )
    except (WorkerFailed, Interrupted) as stop:
        try:
            return stopped(stop, args.json_out)
        finally:
            _discard(stop.result)
    try:
        summary(result)
        if args.json_out:
            write_result(result, args.json_out)
            print(f"results written to {args.json_out}")
    finally:
        _discard(result)
    return 0


def _discard(result: dict | None) -> None:
    from resihp.runtime.control.records import TraceFile

    if result is not None and isinstance(result.get("trace"), TraceFile):
        result["trace"].discard()  # (a temporary one: no run.trace was asked for)


def write_result(result: dict, path: str) -> None:
    """The result as JSON (as `json.dumps` writes it), its `"trace"` streamed (a list or a
    `records.TraceFile`, never held whole here)."""
    from resihp.core.files import write_atomic
    from resihp.runtime.control.records import trace_chunks

    mark = "\0trace\0"  # a placeholder no result holds (its JSON text: the one "\u0000trace\u0000")
    out = {k: v for k, v in result.items() if k not in ("state", "worker_pids")}
    head, tail = json.dumps({**out, "trace": mark}).split(json.dumps(mark))
    write_atomic(path, itertools.chain([head], trace_chunks(out["trace"]), [tail]))


def summary(result: dict) -> None:
    """The losses (up to ten rows), the rates, the events counted, the final layout (stdout)."""
    rows = [[r["iter"], f"{r['loss']:.4f}", f"{r['time_s']:.3f}"] for r in result["iterations"]]
    if rows:
        every = max(1, len(rows) // 10)
        print(
            table(rows[::every] + ([rows[-1]] if (len(rows) - 1) % every else []), ["iter", "loss", "time_s"])
        )
        s = result["summary"]
        print(f"loss {s['first_loss']:.3f} -> {s['final_loss']:.3f}; {s['samples_per_s']:.1f} samples/s, "
              f"{s['tokens_per_s']:.0f} tokens/s; wall {s['wall_s']:.1f} s")  # fmt: skip
    events = result["events"]
    counts = Counter(e["kind"] for e in events)
    fixed = sum(1 for e in events if e["kind"] == "fail-stop" and e.get("recovery"))
    words = [
        f"{n} {k}" + (f" ({fixed} recovered)" if k == "fail-stop" else "") for k, n in sorted(counts.items())
    ]
    print(f"events: {', '.join(words) or 'none'}")
    final = result["plans"][-1]
    print(f"final layout (generation {final['generation']}, {device_count(final)} devices): {layout(final)}")


def stopped(stop, json_out: str | None) -> int:
    """A job that stopped early: its summary and `--json`, then one line on stderr (what happened,
    what was kept, what to do); a worker's traceback follows only when no `--json` keeps it.
    Returns the exit status: 2 (failed), 128 + the signal (interrupted)."""
    from resihp.runtime.job import Interrupted

    result = stop.result
    summary(result)
    n = len(result["iterations"])
    kept = f"{n} committed iteration{'' if n == 1 else 's'}"
    if json_out:
        write_result(result, json_out)
        kept += f" written to {json_out}"
    else:
        kept += " (not kept: no --json)"
    if isinstance(stop, Interrupted):
        line = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}[stop.signum]
        rest, code = [], 128 + stop.signum
    else:
        line, *rest = str(stop).splitlines()
        code = 2
    print("resihp: " + "; ".join(p for p in (line, kept, stop.advice) if p), file=sys.stderr)
    if rest and not json_out:
        print("\n".join(rest), file=sys.stderr)
    return code
