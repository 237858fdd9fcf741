"""`resihp train` configuration: a typed dataclass, TOML loading with key validation, and its Plan.

TOML layout (every key optional; defaults = the embedded default job):

    [model]
    preset = "tiny"              # resihp.core.model_spec presets; or:
    hf = "DIR"                   # a local Hugging Face model directory (config.json, *.safetensors)
    hf_weights = true            # read DIR's weights (false: random weights of its shape, run.seed)
    activation_checkpointing = false  # recompute each block's activations in the backward
    [parallel]
    tp = 2
    pp = 2
    dp = 2
    schedule = "1f1b"            # gpipe | 1f1b | zbh1
    microbatches = 4             # per replica per iteration
    seq_len = 128                # tokens per packed micro-batch
    p2p = "root"                 # root | chunked: SEND/RECV between TP groups (runtime/exec/worker.py)
    [workload]
    lengths = "pystdlib"         # the embedded corpus; or fixed / c4 / github / ... (synthetic bytes)
    seed = 0
    [data]                       # a tokenized dataset instead of [workload] lengths
    path = "FILE.bin"            # flat token ids (`resihp data tokenize` writes one)
    dtype = "uint16"             # uint16 | uint32
    eos_id = 2                   # the id ending every document (required with path)
    [optim]
    lr = 3e-3
    weight_decay = 0.1
    betas = [0.9, 0.95]
    eps = 1e-8
    warmup_iters = 0             # linear warm-up to lr over the first N iterations
    schedule = "constant"        # constant | cosine (to min_lr at decay_iters, default run.iterations)
    min_lr = 0.0
    decay_iters = 150
    grad_clip = 0.0              # max global gradient L2 norm (0: off)
    [run]
    iterations = 150
    seed = 0                     # model initialisation
    workers = 8                  # local worker processes (one per device)
    timing = true                # per-instruction timings in the trace
    trace = "trace.jsonl"        # optional: also write the trace as JSON lines
    faults = "faults.toml"       # optional: [[faults]] to inject (runtime/faults.py)
    checkpoint_every = 0         # optional: save the committed state every N iterations (0: off)
    checkpoint_dir = "ckpt"      # where (runtime/state/checkpoint.py); `resihp train --resume DIR`
    keep_checkpoints = 3         # optional: keep the newest K complete checkpoints (default: all)
    snapshots = false            # in-memory peer snapshots: survive losing every replica of a stage
    link_mb_per_s = 0.0          # nominal P2P bandwidth, MB/s: a block of B bytes takes >= B/bw (0: off)
    heartbeat_timeout_s = 3.0    # a worker silent this long is hung: killed, then a fail-stop (1 to 60)
    devices_per_node = 8         # optional: devices d // devices_per_node share a node agent (default: all)
    nodes = 2                    # `resihp controller`: agents (node ranks 0..n-1) that register
    controller_timeout_s = 2.0   # an agent that cannot reach the controller this long kills its members
    controller_wait_s = 60.0     # how long the controller waits for the agents, and they for a new one
    detect_slow = true           # watch live timings for fail-slows and slow links, replan (false: off)
    device = "cpu"               # cpu | cuda: one local GPU per member (its local rank on the node)
    backend = "gloo"             # gloo (cpu) | nccl (cuda); default: the device's
    precision = "fp32"           # fp32 | bf16 (autocast compute; fp32 master weights and AdamW state)
    [policy]
    name = "resihp"              # the scheduler policy that replans (`resihp policies` lists them)
    horizon_s = 600              # ... plus its options (keyword arguments of the policy class)

A bad key or value raises ValueError naming `section.key`, the value and what is allowed; a plan
that does not fit the model or the requested workers, a missing or unreadable file, an output
that cannot be written, a checkpoint directory that is a file or that another live run holds, and
a fault outside the run or without effect fail the same way (`checks.check_run`), before any process
starts.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields
from functools import cached_property

from resihp.core.files import read_toml
from resihp.core.hf_config import CONFIG, read_config, spec_from_config, weight_files
from resihp.core.model_spec import ModelSpec, model_preset
from resihp.core.plan import SCHEDULES, Plan
from resihp.core.tokens import TokenFile
from resihp.core.workload import FILE, LENGTH_KINDS, Workload
from resihp.sched.base import Policy
from resihp.sched.registry import build_policy

from .checks import check_fits
from .control.hosting import CONTROLLER_TIMEOUT_S, CONTROLLER_WAIT_S, check_hosting
from .control.liveness import HEARTBEAT_TIMEOUT_RANGE_S, HEARTBEAT_TIMEOUT_S
from .job import BACKENDS, DEVICES, PRECISIONS, JobSpec, OptimConfig

P2P_MODES = ("root", "chunked")

RUN_KEYS = (
    "iterations", "seed", "workers", "timing", "trace", "faults", "checkpoint_every", "checkpoint_dir",
    "keep_checkpoints", "snapshots", "link_mb_per_s", "heartbeat_timeout_s", "devices_per_node", "nodes",
    "controller_timeout_s", "controller_wait_s", "detect_slow", "device", "backend", "precision",
)  # fmt: skip
# TOML section -> {key in the file: dataclass field}
SECTIONS: dict[str, dict[str, str]] = {
    "model": {
        "preset": "model",
        "hf": "hf",
        "hf_weights": "hf_weights",
        "activation_checkpointing": "activation_checkpointing",
    },
    "parallel": {k: k for k in ("tp", "pp", "dp", "schedule", "microbatches", "seq_len", "p2p")},
    "workload": {"lengths": "lengths", "seed": "data_seed"},
    "data": {"path": "data_path", "dtype": "data_dtype", "eos_id": "eos_id"},
    "optim": {
        **{k: k for k in ("lr", "weight_decay", "betas", "eps", "warmup_iters", "min_lr", "decay_iters")},
        "schedule": "lr_schedule",
        "grad_clip": "grad_clip",
    },
    "run": {k: k for k in RUN_KEYS},  # every key is its field's name
    "policy": {"name": "policy"},  # every other key of [policy] is an option of that policy
}
_WHERE = {fld: f"{sec}.{key}" for sec, keys in SECTIONS.items() for key, fld in keys.items()}
_WHERE["policy_options"] = "policy"


@dataclass(frozen=True)
class TrainConfig:
    model: str = "tiny"
    hf: str | None = None  # a Hugging Face model directory; replaces the preset
    hf_weights: bool = True
    tp: int = 2
    pp: int = 2
    dp: int = 2
    schedule: str = "1f1b"
    microbatches: int = 4
    seq_len: int = 128
    p2p: str = "root"
    lengths: str = "pystdlib"
    data_seed: int = 0
    data_path: str | None = None
    data_dtype: str = "uint16"
    eos_id: int | None = None
    lr: float = 3e-3
    weight_decay: float = 0.1
    betas: tuple[float, float] = OptimConfig.betas
    eps: float = OptimConfig.eps
    warmup_iters: int = 0
    lr_schedule: str = "constant"
    min_lr: float = 0.0
    decay_iters: int | None = None  # cosine: None = run.iterations
    grad_clip: float = 0.0
    iterations: int = 150
    seed: int = 0
    workers: int = 8
    timing: bool = True
    trace: str | None = None
    faults: str | None = None
    checkpoint_every: int = 0
    checkpoint_dir: str | None = None
    keep_checkpoints: int | None = None
    snapshots: bool = False
    link_mb_per_s: float = 0.0
    heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S
    devices_per_node: int | None = None  # None: every device on one node (one agent)
    nodes: int | None = None  # `resihp controller`: the agents that register (control/hosting.py)
    controller_timeout_s: float = CONTROLLER_TIMEOUT_S
    controller_wait_s: float = CONTROLLER_WAIT_S
    detect_slow: bool = True
    device: str = "cpu"
    backend: str | None = None  # None: the device's (`job.BACKENDS`)
    precision: str = "fp32"
    activation_checkpointing: bool = False
    policy: str = "resihp"
    policy_options: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "microbatches", "seq_len", "iterations", "workers"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{_WHERE[name]} = {v!r}: must be a positive integer")
        for name in ("seed", "data_seed"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{_WHERE[name]} = {v!r}: must be a non-negative integer")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"parallel.schedule = {self.schedule!r}: allowed: {', '.join(SCHEDULES)}")
        if self.p2p not in P2P_MODES:
            raise ValueError(f"parallel.p2p = {self.p2p!r}: allowed: {', '.join(P2P_MODES)}")
        if self.lengths not in LENGTH_KINDS:
            raise ValueError(f"workload.lengths = {self.lengths!r}: allowed: {', '.join(LENGTH_KINDS)}")
        if not isinstance(self.snapshots, bool):
            raise ValueError(f"run.snapshots = {self.snapshots!r}: must be true or false")
        v = self.link_mb_per_s
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < float("inf"):
            raise ValueError(f"run.link_mb_per_s = {v!r}: must be a number >= 0 (MB/s; 0: off)")
        v, (lo, hi) = self.heartbeat_timeout_s, HEARTBEAT_TIMEOUT_RANGE_S
        if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
            raise ValueError(
                f"run.heartbeat_timeout_s = {v!r}: must be a number of seconds in [{lo:g}, {hi:g}]"
            )
        v = self.devices_per_node
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise ValueError(
                f"run.devices_per_node = {v!r}: must be a positive integer (devices d with the same "
                "d // devices_per_node share a node agent; leave it out for one node)"
            )
        check_hosting(self.nodes, self.controller_timeout_s, self.controller_wait_s, v, self.workers)
        if self.device not in DEVICES:
            raise ValueError(f"run.device = {self.device!r}: allowed: {', '.join(DEVICES)}")
        want = BACKENDS[self.device]
        if self.backend is not None and self.backend not in BACKENDS.values():
            raise ValueError(f"run.backend = {self.backend!r}: allowed: {', '.join(BACKENDS.values())}")
        if self.backend is not None and self.backend != want:
            raise ValueError(
                f"run.backend = {self.backend!r} with run.device = {self.device!r}: allowed: {want!r} "
                f"({', '.join(f'{b} on {d}' for d, b in BACKENDS.items())})"
            )
        if self.precision not in PRECISIONS:
            raise ValueError(f"run.precision = {self.precision!r}: allowed: {', '.join(PRECISIONS)}")
        for name in ("timing", "detect_slow", "activation_checkpointing"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{_WHERE[name]} = {getattr(self, name)!r}: must be true or false")
        self.build_policy()  # policy.name and its options
        if self.trace is not None and not isinstance(self.trace, str):
            raise ValueError(f"run.trace = {self.trace!r}: must be a file path")
        if self.faults is not None and not isinstance(self.faults, str):
            raise ValueError(f"run.faults = {self.faults!r}: must be a file path")
        v = self.checkpoint_every
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"run.checkpoint_every = {v!r}: must be a non-negative integer (0: off)")
        if self.checkpoint_dir is not None and not isinstance(self.checkpoint_dir, str):
            raise ValueError(f"run.checkpoint_dir = {self.checkpoint_dir!r}: must be a directory path")
        if v and not self.checkpoint_dir:
            raise ValueError("run.checkpoint_every needs run.checkpoint_dir")
        k = self.keep_checkpoints
        if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
            raise ValueError(f"run.keep_checkpoints = {k!r}: must be an integer >= 1 (omit it: keep all)")
        for name in ("lr", "weight_decay"):
            if isinstance(getattr(self, name), bool) or not isinstance(getattr(self, name), int | float):
                raise ValueError(f"{_WHERE[name]} = {getattr(self, name)!r}: must be a number")
        self.optim()  # range checks of every optimizer key
        self._check_model_and_data()

    def _check_model_and_data(self) -> None:
        """[model] preset or hf, [data] or [workload] lengths, and the vocabulary they share."""
        if self.hf is not None and not isinstance(self.hf, str):
            raise ValueError(f"model.hf = {self.hf!r}: must be a directory path")
        if not isinstance(self.hf_weights, bool):
            raise ValueError(f"model.hf_weights = {self.hf_weights!r}: must be true or false")
        spec = self.spec  # model_preset or config.json's checks
        if self.data_path is not None:
            if self.lengths != TrainConfig.lengths:
                raise ValueError(f"workload.lengths = {self.lengths!r}: give it or data.path, not both")
            if self.eos_id is None:
                raise ValueError("data.path needs data.eos_id (the token id that ends every document)")
            self.tokens()  # dtype and eos_id ranges
        elif self.eos_id is not None or self.data_dtype != TrainConfig.data_dtype:
            raise ValueError("data.dtype and data.eos_id need data.path")
        elif spec.vocab < 256:
            raise ValueError(
                f"the model's vocabulary ({spec.vocab}) does not cover the byte tokens (0..255) of "
                f"workload.lengths = {self.lengths!r}; give data.path"
            )

    # ------------------------------------------------------------------ derived objects
    @cached_property
    def spec(self) -> ModelSpec:
        """The preset, or the Hugging Face directory's config.json (`core.hf_config`)."""
        if self.hf is None:
            return model_preset(self.model)
        where = f"model.hf {os.path.join(self.hf, CONFIG)}"
        name = os.path.basename(os.path.normpath(self.hf))
        return spec_from_config(read_config(self.hf), where, self.seq_len, name=name)

    def hf_config(self) -> dict | None:
        """The imported model's config.json (None for a preset)."""
        return None if self.hf is None else read_config(self.hf)

    def weights_dir(self) -> str | None:
        """The directory whose safetensors the workers read (None: random weights from run.seed):
        `model.hf` when it has weights and `model.hf_weights` is on."""
        if self.hf is None or not self.hf_weights or not weight_files(self.hf):
            return None
        return self.hf

    def tokens(self) -> TokenFile | None:
        if self.data_path is None:
            return None
        return TokenFile(self.data_path, self.data_dtype, self.eos_id)

    @property
    def backend_name(self) -> str:
        """`run.backend`, or the device's default."""
        return self.backend or BACKENDS[self.device]

    def build_policy(self) -> Policy:
        """The `[policy]` section's policy with its options; ValueError naming `policy.KEY`."""
        if not isinstance(self.policy_options, dict):
            raise ValueError(f"[policy] options = {self.policy_options!r}: must be a table")
        return build_policy(self.policy, self.policy_options, "policy")

    def optim(self) -> OptimConfig:
        decay = self.decay_iters
        if decay is None and self.lr_schedule == "cosine":
            decay = self.iterations
        if not isinstance(self.betas, list | tuple):
            raise ValueError(f"optim.betas = {self.betas!r}: must be two numbers, each in [0, 1)")
        return OptimConfig(
            lr=float(self.lr), betas=tuple(self.betas), eps=self.eps, weight_decay=float(self.weight_decay),
            warmup_iters=self.warmup_iters, schedule=self.lr_schedule, min_lr=self.min_lr,
            decay_iters=decay, grad_clip=self.grad_clip,
        )  # fmt: skip

    def workload(self) -> Workload:
        tokens = self.tokens()
        if tokens is not None:
            return Workload(self.seq_len, self.microbatches, FILE, self.data_seed, tokens=tokens)
        return Workload(self.seq_len, self.microbatches, self.lengths, self.data_seed)

    def plan(self) -> Plan:
        """The uniform tp x pp x dp plan; ValueError when it does not fit the model or the workers."""
        plan = Plan.uniform(self.spec, self.tp, self.pp, self.dp, self.microbatches, self.schedule)
        check_fits(plan, self.workers, self.device)
        return plan

    def job_spec(
        self,
        plan: Plan,
        *,
        workload: Workload | None = None,
        weights: str | None = None,
        start: int = 0,
        return_state: bool = False,
        resume: str | None = None,
    ) -> JobSpec:
        """What every member of this config's run gets, for `plan` from iteration `start`:
        `workload` (default `self.workload()`; a resumed token-file run reads on from its
        checkpoint's position), `weights` (the safetensors directory each member reads its shard
        from, `weights_dir()`; None: initialise from run.seed)."""
        return JobSpec(
            spec=plan.model,
            workload=self.workload() if workload is None else workload,
            optim=self.optim(),
            seed=self.seed,
            iterations=self.iterations - start,
            start_iteration=start,
            timing=self.timing,
            return_state=return_state,
            p2p=self.p2p,
            link_mb_per_s=float(self.link_mb_per_s),
            checkpoint_every=self.checkpoint_every,
            checkpoint_dir=self.checkpoint_dir,
            keep_checkpoints=self.keep_checkpoints,
            resume=resume,
            snapshots=self.snapshots,
            device=self.device,
            backend=self.backend_name,
            precision=self.precision,
            activation_checkpointing=self.activation_checkpointing,
            devices_per_node=self.devices_per_node,
            weights=weights,
            hf_config=self.hf_config(),
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_toml(cls, path: str, what: str = "--config") -> TrainConfig:
        """The config in file `path` (`what`: how the user named it, for messages)."""
        return cls.from_dict(read_toml(path, what))

    @classmethod
    def from_dict(cls, data: dict) -> TrainConfig:
        """From the nested TOML layout; unknown sections or keys raise ValueError."""
        kwargs = {}
        for sec, body in data.items():
            if sec not in SECTIONS:
                raise ValueError(f"unknown section [{sec}]; allowed: {', '.join(SECTIONS)}")
            if not isinstance(body, dict):
                raise ValueError(f"[{sec}] must be a table")
            if sec == "model" and "preset" in body and "hf" in body:
                raise ValueError("model.preset and model.hf: give one of them")
            for key, value in body.items():
                if sec == "policy" and key != "name":  # an option, checked by `build_policy`
                    kwargs.setdefault("policy_options", {})[key] = value
                    continue
                if key not in SECTIONS[sec]:
                    raise ValueError(f"unknown key {sec}.{key}; allowed: {', '.join(SECTIONS[sec])}")
                kwargs[SECTIONS[sec][key]] = value
        return cls(**kwargs)


assert {f.name for f in fields(TrainConfig)} == set(_WHERE), "every field has a TOML key"
