"""What every process of a job shares: its description (`JobSpec`, with the optimizer's `OptimConfig`)
and how a job ends early: `WorkerFailed` (it cannot go on) or `Interrupted` (SIGINT / SIGTERM).
Torch-free: the node agents import it too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from resihp.core.model_spec import ModelSpec
from resihp.core.workload import Workload

__all__ = ["Interrupted", "JobSpec", "OptimConfig", "WorkerFailed"]


@dataclass(frozen=True)
class OptimConfig:
    """AdamW hyper-parameters; weight decay applies to matrices only (not to norms or biases)."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"optim.lr = {self.lr!r}: must be > 0")
        if not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"optim.betas = {self.betas!r}: each must be in [0, 1)")
        if not self.eps > 0:
            raise ValueError(f"optim.eps = {self.eps!r}: must be > 0")
        if self.weight_decay < 0:
            raise ValueError(f"optim.weight_decay = {self.weight_decay!r}: must be >= 0")


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
    p2p: str = "root"  # "root" | "chunked": how SEND/RECV cross TP groups (exec/worker.py)
    link_mb_per_s: float = 0.0  # nominal P2P bandwidth of the link model (worker._transfer); 0: off
    # Elastic runtime only (state/checkpoint.py): save the committed state every `checkpoint_every`
    # iterations into `checkpoint_dir`; `resume`: a checkpoint directory to start from (then
    # `start_iteration` is its iteration, and the optimizer step count is absolute).
    checkpoint_every: int = 0
    checkpoint_dir: str | None = None
    resume: str | None = None
    snapshots: bool = False  # keep a peer's committed shard in memory (state/snapshot.py)


class WorkerFailed(RuntimeError):
    """A worker raised or died and the job cannot go on; every child has been reaped when this
    propagates. `devices`: those blamed; `pids`: every process the job started (the orphan check).

    The first line of the message says what happened (further lines: a worker's traceback). On its
    way out the controller sets `advice` (what the user can do: resume from a checkpoint, or rerun
    with one) and `output` (what it had when the job stopped, as `launch_elastic` returns it);
    `run_training` sets `result`, the run's result up to the failure (what `--json` writes)."""

    def __init__(self, message: str, devices: list[int], pids: list[int]) -> None:
        super().__init__(message)
        self.devices, self.pids = devices, pids
        self.advice: str = ""
        self.output: dict | None = None
        self.result: dict | None = None


class Interrupted(BaseException):
    """The job was stopped by signal `signum` (SIGINT or SIGTERM) and torn down in order: every child
    reaped, the committed iterations kept. A BaseException, as KeyboardInterrupt is, so that no
    `except Exception` on the way swallows it. `output` and `result` as for `WorkerFailed`."""

    def __init__(self, signum: int, pids: list[int]) -> None:
        super().__init__(signum)
        self.signum, self.pids = signum, pids
        self.advice: str = ""
        self.output: dict | None = None
        self.result: dict | None = None
