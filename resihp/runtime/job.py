"""What every process of a job shares: its description (`JobSpec`, with the optimizer's `OptimConfig`)
and the error of a job that cannot go on (`WorkerFailed`). Torch-free: the node agents import it too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from resihp.core.model_spec import ModelSpec
from resihp.core.workload import Workload

__all__ = ["BACKENDS", "DEVICES", "PRECISIONS", "JobSpec", "OptimConfig", "WorkerFailed"]

DEVICES = ("cpu", "cuda")  # `run.device`: what every member computes on
BACKENDS = {"cpu": "gloo", "cuda": "nccl"}  # `run.backend`: the one allowed per device (its default)
PRECISIONS = ("fp32", "bf16")  # `run.precision`: compute dtype; master weights and Adam stay fp32


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
    # Device backend (exec/device.py): every tensor of a member lives on its device; on CUDA a
    # member takes GPU `device % devices_per_node` (its local rank on the node; None: one node).
    device: str = "cpu"
    backend: str = "gloo"
    precision: str = "fp32"
    activation_checkpointing: bool = False
    devices_per_node: int | None = None


class WorkerFailed(RuntimeError):
    """A worker raised or died and the job cannot go on; every child has been reaped when this
    propagates. `devices`: those blamed; `pids`: every process the job started (the orphan check)."""

    def __init__(self, message: str, devices: list[int], pids: list[int]) -> None:
        super().__init__(message)
        self.devices, self.pids = devices, pids
