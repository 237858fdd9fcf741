"""`resihp train`: run a job on local CPU workers and return the architecture §5.5 JSON.

`run_training(config)` validates the config and its Plan (ValueError before any process starts),
launches the controller + one gloo worker per device (`controller.launch_elastic`: every run
commits its iterations and survives failures), shows live progress, and returns

    {"config": {...}, "seed": 0, "plan": {...},
     "iterations": [{"iter", "loss", "time_s", "samples", "tokens", "generation"}, ...],
     "events": [], "summary": {...}, "trace": [per-device records, docs/trace-format.md]}

`loss` is the mean cross-entropy per target token of the iteration's global batch (the reference's
definition), `time_s` the slowest device's wall time of the iteration, `samples` the number of
packed sequences (micro-batches) and `tokens` = samples x seq_len.
"""

from __future__ import annotations

import json
import sys
import time

from resihp.core.plan import Plan
from resihp.core.trace_format import record_to_json
from resihp.model.loss import iteration_loss
from resihp.sched.base import Policy

from .config import TrainConfig, check_fits, check_run
from .control.controller import launch_elastic
from .control.protocol import Reached
from .state.dirlock import acquire

TRACE_VERSION = 1
FROM_CONFIG = object()  # run_training's `policy` default: the config's [policy]


class Progress:
    """Live progress on stderr (stdout stays free for JSON): a rich bar when stderr is a TTY and
    rich is installed, one plain line per iteration otherwise."""

    def __init__(self, total: int, enabled: bool = True, stream=None) -> None:
        self.total, self.enabled = total, enabled
        self.stream = stream or sys.stderr
        self._rich = None
        if enabled and self.stream.isatty():
            try:
                from rich.console import Console
                from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

                self._rich = Progress(
                    TextColumn("[bold]train"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TextColumn("{task.description}"),
                    console=Console(file=self.stream),
                    transient=False,
                )
                self._task = self._rich.add_task("starting workers", total=total)
                self._rich.start()
            except ImportError:
                self._rich = None

    def update(self, row: dict, samples_per_s: float) -> None:
        if not self.enabled:
            return
        text = (
            f"iter {row['iter'] + 1}/{self.total}  loss {row['loss']:.4f}  "
            f"samples/s {samples_per_s:.1f}  gen {row['generation']}"
        )
        if self._rich is not None:
            self._rich.update(self._task, advance=1, description=text)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self._rich is not None:
            self._rich.stop()


def iteration_row(plan: Plan, seq_len: int, it: int, reached: list[Reached]) -> dict:
    """One `iterations` entry from every plan device's `Reached` message of iteration `it`."""
    losses = sorted(row for r in reached for row in r.losses)  # LossRows, in global mb order
    assert len(losses) == plan.global_microbatches, (it, len(losses))
    g = plan.global_microbatches
    loss = iteration_loss(sum(x.loss for x in losses), g, seq_len, sum(x.targets for x in losses))
    return {
        "iter": it,
        "loss": loss,
        "time_s": max(r.wall_s for r in reached),
        "samples": g,
        "tokens": g * seq_len,
        "generation": plan.generation,
    }


def run_training(
    config: TrainConfig | None = None,
    plan: Plan | None = None,
    *,
    progress: bool = True,
    return_state: bool = False,
    replans: list[tuple[int, Plan]] | tuple = (),
    policy: Policy | None | object = FROM_CONFIG,
    resume: str | None = None,
) -> dict:
    """Train `config` (default: the embedded job) under `plan` (default: `config.plan()`).

    An explicit `plan` overrides the config's model, tp/pp/dp, schedule and micro-batch counts.
    With `return_state`, the result also carries `"state"`: replica -> full state dict (tensors;
    not JSON) gathered from the workers' shards at the end (under the final plan).

    Every job runs on the elastic runtime (`controller.launch_elastic`): `config.faults` (a faults
    TOML) are injected, `replans` ([(iteration, Plan)]) switch plans at iteration boundaries,
    fail-stops are recovered without restart, and `events` records what happened;
    `config.detect_slow` also detects slow devices and links from live timings and replans.
    The scheduler policy that replans is the config's `[policy]` (`config.build_policy()`);
    `policy` overrides it, None for the runtime's own rules (`reconfig.shrink_plan`,
    `reconfig.rebalance_slow`).

    `config.checkpoint_every` saves the committed state periodically (`checkpoint.py`); `resume`
    (a checkpoint directory, or a `checkpoint_dir` with a `latest`) restarts the job from it under
    `plan`, which may differ from the one that wrote it: iterations `[checkpoint, config.iterations)`.
    """
    config = config or TrainConfig()
    if plan is None:
        plan = config.plan()
    start = 0
    if resume is not None:
        from .state.checkpoint import load_meta, resolve

        resume = resolve(resume)
        start = load_meta(resume)["iteration"]
        if start >= config.iterations:
            raise ValueError(
                f"--resume: the checkpoint is at iteration {start}, run.iterations = {config.iterations}"
            )
    faults = check_run(config, plan, start)
    if config.device == "cuda":  # the GPUs, before any process starts (needs torch: not in check_run)
        from .exec.device import check_cuda

        check_cuda([*plan.devices(), *plan.standby], config.devices_per_node)
    for _, p in replans:
        check_fits(p, config.workers, config.device)
        if not set(p.devices()) | set(p.standby) <= set(plan.devices()) | set(plan.standby):
            raise ValueError(f"a replan uses devices outside the initial plan: {p.devices()}")
    workload = config.workload()
    job = config.job_spec(plan, start=start, return_state=return_state, resume=resume)
    rows: list[dict] = []
    events: list[dict] = []
    lock = acquire(config.checkpoint_dir) if config.checkpoint_dir else None  # released at the end
    bar = Progress(config.iterations, enabled=progress)
    t_start = time.perf_counter()

    def on_commit(it: int, current: Plan, reached: list[Reached]) -> None:
        row = iteration_row(current, workload.seq_len, it, reached)
        rows.append(row)
        bar.update(row, row["samples"] / max(row["time_s"], 1e-9))

    try:
        out = launch_elastic(
            plan,
            job,
            faults=faults,
            replans=replans,
            on_commit=on_commit,
            detect_slow=config.detect_slow,
            policy=config.build_policy() if policy is FROM_CONFIG else policy,
            heartbeat_timeout_s=float(config.heartbeat_timeout_s),
            devices_per_node=config.devices_per_node,
        )
        # time-keyed faults with the iteration the controller resolved them to (unresolved: none)
        injected = [(f, f.at_iter, None) for f in faults if f.at_iter is not None] + out["faults"]
        for f, at_iter, elapsed_s in injected:
            event = {"iter": at_iter, "kind": f"inject-{f.kind}", "devices": list(f.devices)}
            if f.kind == "stop" and (f.phase != "start" or f.hang):
                event.update(phase=f.phase, hang=f.hang)
            if f.severity is not None:
                event["severity"] = f.severity
            if f.duration_s is not None:
                event["duration_s"] = f.duration_s
            if f.at_s is not None:
                event.update(at_s=f.at_s, elapsed_s=elapsed_s)
            events.append(event)
        events.extend(out["events"])
        events.sort(key=lambda e: e["iter"])
    finally:
        bar.close()
        if lock is not None:
            lock.release()
    elapsed = time.perf_counter() - t_start
    trace = [record_to_json(rec) for it in sorted(out["records"]) for rec in out["records"][it]]
    if config.trace:
        with open(config.trace, "w") as f:
            for rec in trace:
                f.write(json.dumps(rec) + "\n")
    steady = rows[1:] or rows
    run_s = sum(r["time_s"] for r in steady)
    result = {
        "config": config.to_dict(),
        "seed": config.seed,
        "plan": plan.to_dict(),
        "iterations": rows,
        "events": events,
        "summary": {
            "wall_s": elapsed,
            "first_loss": rows[0]["loss"],
            "final_loss": rows[-1]["loss"],
            "samples_per_s": sum(r["samples"] for r in steady) / max(run_s, 1e-9),
            "tokens_per_s": sum(r["tokens"] for r in steady) / max(run_s, 1e-9),
        },
        "trace_version": TRACE_VERSION,
        "trace": trace,
    }
    result["worker_pids"] = out["pids"]
    if "plans" in out:
        result["plans"] = [p.to_dict() for p in out["plans"]]
    if return_state:
        result["state"] = out["state"]
    return result
