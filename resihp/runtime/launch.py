"""Process plumbing of a local job, shared by the controller (`controller.py`) and its members.

`JobSpec` is what every worker needs besides the Plan; `WorkerFailed` (`agent.py`) is the error of a
job that cannot go on (every child reaped when it propagates); `exit_after` is a worker process's
one exit path; `_gather` collects the workers' final shards; `alive` is the tests' orphan check.
Spawning, watching and reaping processes is the node agents' job (`agent.py`).
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from resihp.core.model_spec import ModelSpec
from resihp.core.plan import Plan
from resihp.core.workload import Workload
from resihp.model import gather_state

from .control.agent import WorkerFailed, running
from .reference import OptimConfig

__all__ = ["JobSpec", "WorkerFailed", "alive", "exit_after"]

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


def exit_after(device: int, results, body, before_exit: Callable[[], None] | None = None) -> None:
    """Run a worker process's `body()`, report an exception to the controller with its traceback,
    call `before_exit` (the heartbeat's stop), flush the result queue and exit without interpreter
    teardown (torch's takes seconds)."""
    try:
        body()
        code = 0
    except BaseException:
        results.put(("error", device, traceback.format_exc()))
        code = 1
    if before_exit is not None:
        before_exit()
    results.close()
    results.join_thread()
    os._exit(code)


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
    return [pid for pid in pids if running(pid)]
