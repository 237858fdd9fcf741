"""`resihp train`: run a job on local CPU workers and return the architecture §5.5 JSON.

`run_training(config)` validates the config and its Plan (ValueError before any process starts),
launches the controller + one gloo worker per device (`controller.launch_elastic`: every run
commits its iterations and survives failures), shows live progress and events (`live.py`), and
returns

    {"config": {...}, "seed": 0, "plan": {...}, "status": "done",
     "iterations": [{"iter", "loss", "time_s", "samples", "tokens", "generation"}, ...],
     "events": [], "summary": {...}, "trace": [per-device records, docs/trace-format.md]}

A job that stops early raises (`WorkerFailed`: it cannot go on; `Interrupted`: SIGINT / SIGTERM)
with that result up to the stop as `result` (status "failed" / "interrupted"; every committed
iteration, every event, the stop as the last one; the trace file written), so that the caller
can keep it.

`loss` is the mean cross-entropy per target token of the iteration's global batch (the reference's
definition), `time_s` the slowest device's wall time of the iteration, `samples` the number of
packed sequences (micro-batches) and `tokens` = samples x seq_len.
"""

from __future__ import annotations

import time

from resihp.core.plan import Plan
from resihp.model.loss import iteration_loss
from resihp.sched.base import Policy

from .checks import check_fits, check_run
from .config import TrainConfig
from .control.controller import launch_elastic
from .control.hosting import Hosting
from .control.protocol import Reached
from .control.records import TraceFile
from .job import Interrupted, WorkerFailed
from .live import Progress
from .state.dirlock import acquire

TRACE_VERSION = 1
FROM_CONFIG = object()  # run_training's `policy` default: the config's [policy]


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
    listen: tuple[str, int] | None = None,
    trace_as: str = "list",
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

    `listen`: (host, port) where the controller's store listens for the `run.nodes` agents that
    `resihp agent` starts (`resihp controller`; None: the embedded agents, forked here).

    The trace records stream to `config.trace` (else, unless `trace_as` is "none", to a temporary
    file) as the run goes (`records.RecordStore`); the result's `"trace"` is that file read back
    (`trace_as` "list"), the file itself (`records.TraceFile`, "file": the caller streams it, e.g.
    `--json`, and discards it) or empty ("none").

    `progress`: live progress and events on stderr (`live.Progress`). A job that cannot go on
    raises `WorkerFailed`, one stopped by SIGINT / SIGTERM `Interrupted` — after every process is
    reaped and the trace file written; its `result` is the run's result up to the stop and its
    `advice` what the user can do (resume from a checkpoint, or rerun with one).
    """
    config = config or TrainConfig()
    if plan is None:
        plan = config.plan()
    start = 0
    workload = config.workload()
    if resume is not None:  # verified here, before any process starts (`state.verify`)
        from .state.verify import check_model, newest_usable

        resume, meta = newest_usable(resume)
        check_model(meta, plan.model, f"--resume {resume}")
        start = meta["iteration"]
        if start >= config.iterations:
            raise ValueError(
                f"--resume: the checkpoint is at iteration {start}, run.iterations = {config.iterations}"
            )
        if meta.get("data") is not None:  # a token file: read on from the checkpoint's token
            workload = workload.at_position(start, meta["data"]["tokens"])
    faults = check_run(config, plan, start)
    weights = config.weights_dir()
    if weights is not None:
        from resihp.model.hf import check_weights

        check_weights(weights, plan.model)
    if config.device == "cuda" and listen is None:  # this host's GPUs, for every (embedded) agent:
        from .exec.device import check_cuda  # needs torch (not in check_run); `resihp agent` checks its own

        check_cuda([*plan.devices(), *plan.standby], config.devices_per_node)
    for _, p in replans:
        check_fits(p, config.workers, config.device)
        if not set(p.devices()) | set(p.standby) <= set(plan.devices()) | set(plan.standby):
            raise ValueError(f"a replan uses devices outside the initial plan: {p.devices()}")
    job = config.job_spec(
        plan, workload=workload, weights=weights, start=start, return_state=return_state, resume=resume
    )
    rows: list[dict] = []
    lock = acquire(config.checkpoint_dir) if config.checkpoint_dir else None  # released at the end
    bar = Progress(config.iterations, enabled=progress)
    t_start = time.perf_counter()

    def on_commit(it: int, current: Plan, reached: list[Reached]) -> None:
        row = iteration_row(current, workload.seq_len, it, reached)
        while rows and rows[-1]["iter"] >= it:  # a rewind (restart, rollback: adapt/restart.py) re-ran it
            rows.pop()
        rows.append(row)
        bar.update(row, row["samples"] / max(row["time_s"], 1e-9))

    trace = trace_file(config.trace, trace_as)
    stopped: WorkerFailed | Interrupted | None = None
    try:
        try:
            out = launch_elastic(
                plan,
                job,
                faults=faults,
                replans=replans,
                on_commit=on_commit,
                on_event=bar.event,
                detect_slow=config.detect_slow,
                policy=config.build_policy() if policy is FROM_CONFIG else policy,
                heartbeat_timeout_s=float(config.heartbeat_timeout_s),
                devices_per_node=config.devices_per_node,
                hosting=Hosting(
                    listen or ("127.0.0.1", 0),
                    config.nodes if listen else None,
                    config.controller_wait_s,
                    config.controller_timeout_s,
                    config.devices_per_node,
                    config.device,
                ),  # fmt: skip
                trace=None if trace is None else trace.path,
            )
        except (WorkerFailed, Interrupted) as stop:
            assert stop.output is not None, "the controller attaches what it had"
            out, stopped = stop.output, stop
    except BaseException:  # (a bug, a user error before any process started): no trace to keep
        if trace is not None:
            trace.discard()
        raise
    finally:
        bar.close()
        if lock is not None:
            lock.release()
    if trace is not None and trace_as == "list":
        out["trace"] = trace.read()
        trace.discard()
    else:
        out["trace"] = trace if trace is not None and trace_as == "file" else []
    result = run_result(config, plan, rows, out, time.perf_counter() - t_start, stopped)
    if return_state:
        result["state"] = out["state"]
    if stopped is not None:
        stopped.result = result
        raise stopped
    return result


def trace_file(path: str | None, trace_as: str) -> TraceFile | None:
    """Where the run's records stream: `path` (`run.trace`), else a temporary file unless
    `trace_as` is "none" (no trace wanted: None)."""
    if trace_as not in ("list", "file", "none"):
        raise ValueError(f"trace_as = {trace_as!r}: must be list, file or none")
    if path is not None:
        return TraceFile(path, temporary=False)
    if trace_as == "none":
        return None
    return TraceFile.nameless()  # (nothing left in $TMPDIR, even by a SIGKILLed run)


def run_result(
    config: TrainConfig, plan: Plan, rows: list[dict], out: dict, wall_s: float, stopped=None
) -> dict:
    """The architecture §5.5 result of a run from its committed `rows` and the controller's `out`
    (`stopped`: the exception of a job that stopped early, else None). Events are sorted by
    iteration (stable: in the order made within one); the summary's rates leave iteration 0 out
    (start-up), and a run that committed nothing has no losses."""
    steady = rows[1:] or rows
    run_s = sum(r["time_s"] for r in steady)
    status = "done" if stopped is None else "interrupted" if isinstance(stopped, Interrupted) else "failed"
    result = {
        "config": config.to_dict(),
        "seed": config.seed,
        "plan": plan.to_dict(),
        "status": status,
        "iterations": rows,
        "events": sorted(out["events"], key=lambda e: e["iter"]),
        "summary": {
            "wall_s": wall_s,
            "first_loss": rows[0]["loss"] if rows else None,
            "final_loss": rows[-1]["loss"] if rows else None,
            "samples_per_s": sum(r["samples"] for r in steady) / max(run_s, 1e-9),
            "tokens_per_s": sum(r["tokens"] for r in steady) / max(run_s, 1e-9),
        },
        "trace_version": TRACE_VERSION,
        "trace": out["trace"],
    }
    result["worker_pids"] = out["pids"]
    result["plans"] = [p.to_dict() for p in out["plans"]]
    return result
