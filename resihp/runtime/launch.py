"""Process plumbing of a local job, shared by the controller (`controller.py`) and its members.

`JobSpec` is what every worker needs besides the Plan; `WorkerFailed` is the error of a job that
cannot go on (every child reaped when it propagates); `exit_after` is a worker process's one exit
path; `_watch_controller` makes a worker exit when the controller is gone; `_fail` / `_reap` /
`_gather` / `alive` are the controller's helpers for blaming, reaping and collecting workers.
"""

from __future__ import annotations

import os
import queue as queue_mod
import signal
import threading
import time
import traceback
from dataclasses import dataclass, field

import torch

from resihp.core.model_spec import ModelSpec
from resihp.core.plan import Plan
from resihp.core.workload import Workload
from resihp.model import gather_state

from .reference import OptimConfig

PG_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class JobSpec:
    """What every worker needs besides the Plan (picklable)."""

    spec: ModelSpec
    workload: Workload
    optim: OptimConfig = field(default_factory=OptimConfig)
    seed: int = 0
    iterations: int = 1
    start_iteration: int = 0
    timing: bool = True
    return_state: bool = False
    p2p: str = "root"  # "root" | "chunked": how SEND/RECV cross TP groups (worker.py)
    link_mb_per_s: float = 0.0  # nominal P2P bandwidth of the link model (worker._transfer); 0: off
    # Elastic runtime only (checkpoint.py): save the committed state every `checkpoint_every`
    # iterations into `checkpoint_dir`; `resume`: a checkpoint directory to start from (then
    # `start_iteration` is its iteration, and the optimizer step count is absolute).
    checkpoint_every: int = 0
    checkpoint_dir: str | None = None
    resume: str | None = None
    snapshots: bool = False  # keep a peer's committed shard in memory (snapshot.py)


class WorkerFailed(RuntimeError):
    """A worker raised or died; every child has been reaped when this propagates."""

    def __init__(self, message: str, devices: list[int], pids: list[int]) -> None:
        super().__init__(message)
        self.devices, self.pids = devices, pids


def _watch_controller(pid: int, period_s: float = 1.0) -> None:
    """Exit this worker at once when the controller process is gone (even SIGKILLed), so that no
    worker outlives it; polled from a daemon thread."""

    def watch() -> None:
        while True:
            time.sleep(period_s)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os._exit(3)

    threading.Thread(target=watch, name="controller-watchdog", daemon=True).start()


def exit_after(device: int, results, body) -> None:
    """Run a worker process's `body()`, report an exception to the controller with its traceback,
    flush the result queue and exit without interpreter teardown (torch's takes seconds)."""
    try:
        body()
        code = 0
    except BaseException:
        results.put(("error", device, traceback.format_exc()))
        code = 1
    results.close()
    results.join_thread()
    os._exit(code)


def _fail(by_dev: dict, done: set[int], errors: dict[int, str], results) -> None:
    """Raise WorkerFailed blaming, first, workers that died without a word (the likely root cause:
    their peers' collectives then fail with "connection closed"), then those that raised."""
    deadline = time.monotonic() + 1.0  # let the other consequences of one failure arrive
    while time.monotonic() < deadline:
        try:
            kind, dev, payload = results.get(timeout=0.1)
        except queue_mod.Empty:
            continue
        if kind == "error":
            errors[dev] = payload
    dead = [d for d, p in by_dev.items() if d not in done and d not in errors and p.exitcode not in (None, 0)]
    lines = [f"worker of device {d} died (exit code {by_dev[d].exitcode})" for d in dead]
    lines += [f"worker of device {d} failed:\n{tb}" for d, tb in sorted(errors.items())]
    pids = [p.pid for p in by_dev.values()]
    raise WorkerFailed("\n".join(lines), dead + sorted(errors), pids)


def _reap(procs: list) -> None:
    """Terminate, then kill, every child still alive; join them all."""
    for p in procs:
        if p.is_alive():
            p.terminate()
            os.kill(p.pid, signal.SIGCONT)  # a frozen (SIGSTOPped) child acts on SIGTERM once continued
    deadline = time.monotonic() + 5.0
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def _gather(plan: Plan, shards: dict[int, dict]) -> dict[int, dict[str, torch.Tensor]]:
    """replica -> full state dict, from the TP shards of each of its (non-hollow) stages."""
    out: dict[int, dict[str, torch.Tensor]] = {}
    for d, stages in enumerate(plan.replicas):
        full: dict[str, torch.Tensor] = {}
        for st in stages:
            if st.hollow:
                continue
            pieces = [{n: torch.from_numpy(a) for n, a in shards[dev].items()} for dev in st.devices]
            full.update(gather_state(plan.model, pieces, st.tp_split, st.ffn_split, "copy"))
        out[d] = full
    return out


def alive(pids: list[int]) -> list[int]:
    """The subset of `pids` still running (not exited, not zombie); tests assert it is empty."""
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            out.append(pid)
    return out
