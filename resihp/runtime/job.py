"""What every process of a job shares: its description (`JobSpec`, with the optimizer's `OptimConfig`)
and how a job ends early: `WorkerFailed` (it cannot go on) or `Interrupted` (SIGINT / SIGTERM).
Torch-free: the node agents import it too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from resihp.core.model_spec import ModelSpec
from resihp.core.workload import Workload

__all__ = ["BACKENDS", "DEVICES", "PRECISIONS", "Interrupted", "JobSpec", "OptimConfig", "WorkerFailed"]


LR_SCHEDULES = ("constant", "cosine")
DEVICES = ("cpu", "cuda")  # `run.device`: what every member computes on
BACKENDS = {"cpu": "gloo", "cuda": "nccl"}  # `run.backend`: the one allowed per device (its default)
PRECISIONS = ("fp32", "bf16")  # `run.precision`: compute dtype; master weights and Adam stay fp32


def _is_number(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, int | float)


@dataclass(frozen=True)
class OptimConfig:
    """AdamW hyper-parameters; weight decay applies to matrices only (not to norms or biases).

    The learning rate of iteration k (`exec.optim.learning_rate`): linear warm-up to `lr` over the
    first `warmup_iters` iterations, then `lr` (`schedule = "constant"`) or a cosine from `lr` down
    to `min_lr` at iteration `decay_iters` and `min_lr` after it (`"cosine"`). `grad_clip` > 0
    scales the gradient so that its global L2 norm — over the whole model, each element once — is
    at most `grad_clip` (`exec.optim.clip_coefficient`); 0 turns clipping off.
    """

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    warmup_iters: int = 0
    schedule: str = "constant"
    min_lr: float = 0.0
    decay_iters: int | None = None  # cosine: the iteration reaching min_lr (None: no decay)
    grad_clip: float = 0.0

    def __post_init__(self) -> None:
        for key in ("lr", "eps", "weight_decay", "min_lr", "grad_clip"):
            if not _is_number(getattr(self, key)):
                raise ValueError(f"optim.{key} = {getattr(self, key)!r}: must be a number")
        if not 0 <= self.lr < float("inf"):
            raise ValueError(f"optim.lr = {self.lr!r}: must be >= 0 (0: parameters never move)")
        betas = self.betas
        if (
            not isinstance(betas, tuple | list)
            or len(betas) != 2
            or not all(_is_number(b) and 0 <= b < 1 for b in betas)
        ):
            raise ValueError(f"optim.betas = {betas!r}: must be two numbers, each in [0, 1)")
        if not self.eps > 0:
            raise ValueError(f"optim.eps = {self.eps!r}: must be > 0")
        if self.weight_decay < 0:
            raise ValueError(f"optim.weight_decay = {self.weight_decay!r}: must be >= 0")
        v = self.warmup_iters
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"optim.warmup_iters = {v!r}: must be a non-negative integer")
        if self.schedule not in LR_SCHEDULES:
            raise ValueError(f"optim.schedule = {self.schedule!r}: allowed: {', '.join(LR_SCHEDULES)}")
        if self.schedule == "constant" and self.min_lr:
            raise ValueError(f"optim.min_lr = {self.min_lr!r}: only with optim.schedule = 'cosine'")
        if not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"optim.min_lr = {self.min_lr!r}: must be in [0, optim.lr = {self.lr!r}]")
        v = self.decay_iters
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= self.warmup_iters):
            raise ValueError(
                f"optim.decay_iters = {v!r}: must be an integer > optim.warmup_iters = {self.warmup_iters}"
            )
        if self.schedule == "cosine" and v is None:
            raise ValueError(
                "optim.schedule = 'cosine' needs optim.decay_iters (the iteration reaching min_lr)"
            )
        if not 0 <= self.grad_clip < float("inf"):
            raise ValueError(f"optim.grad_clip = {self.grad_clip!r}: must be >= 0 (0: off)")
        object.__setattr__(self, "betas", (float(betas[0]), float(betas[1])))


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
    keep_checkpoints: int | None = None  # retention: the newest K complete checkpoints (None: all)
    resume: str | None = None
    snapshots: bool = False  # keep a peer's committed shard in memory (state/snapshot.py)
    # A Hugging Face model (`[model] hf`): `weights`, the directory whose safetensors each worker
    # reads its shard from (None: initialise from `seed`); `hf_config`, its config.json, kept in
    # checkpoints so that `resihp export` writes the same architecture and token ids back.
    weights: str | None = None
    hf_config: dict | None = None
    # Device backend (exec/device.py): every tensor of a member lives on its device; on CUDA a
    # member takes GPU `device % devices_per_node` (its local rank on the node; None: one node).
    device: str = "cpu"
    backend: str = "gloo"
    precision: str = "fp32"
    activation_checkpointing: bool = False
    devices_per_node: int | None = None


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
