"""The member's device: which one, whether the machine has it, and the compute precision on it.

`run.device = "cuda"` gives each member one GPU of its node: its local rank there,
`device % run.devices_per_node` (every device on one node without it). `check_cuda` refuses,
before any process starts, a job that would put two members on one GPU or that asks for CUDA on a
machine without it: `resihp train` checks this host for every node (its agents all run here, so
several nodes would share its GPUs); each `resihp agent` of a `resihp controller` run checks its
own machine at start-up (`control/serve.check_node`), the controller's host needing none.

`run.precision = "bf16"` is mixed precision: parameters, gradients and AdamW state stay fp32 (the
master weights); the forward runs under `torch.autocast(dtype=bfloat16)`, which casts weights and
activations to bf16 per matmul (and attention), so the backward produces fp32 gradients for the
fp32 masters and the data-parallel reduction sums fp32. That doubles the reduction's bytes against
bf16 gradients, and buys sums free of bf16 rounding across replicas (no fp32 accumulate to build).
Loss scaling is not needed: bf16 has fp32's exponent range. The residual stream (embedding +
partial sums) stays fp32, so pipeline activations travel in fp32 too; the TP all-reduces of
branch outputs inside a layer sum bf16 (as Megatron's).
"""

from __future__ import annotations

import contextlib

import torch

from ..job import JobSpec


def local_rank(device: int, devices_per_node: int | None) -> int:
    """The device's index on its node (= its GPU there)."""
    return device if devices_per_node is None else device % devices_per_node


def member_device(job: JobSpec, device: int) -> torch.device:
    """The torch device of `device`'s member (on CUDA also made the current device: NCCL and
    `batch_isend_irecv` need it set before the first collective)."""
    if job.device == "cpu":
        return torch.device("cpu")
    index = local_rank(device, job.devices_per_node)
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def check_cuda(devices: list[int], devices_per_node: int | None, available: int | None = None) -> None:
    """ValueError unless this host has a distinct GPU for every member it runs: `devices` (every
    device the job may run here, standby included) on nodes of `devices_per_node`, all on this host.
    `available`: the GPU count (default: `torch.cuda.device_count()`, 0 without CUDA)."""
    if available is None:
        available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if available == 0:
        raise ValueError("run.device = 'cuda': this machine has no CUDA device (torch sees none); use 'cpu'")
    nodes = {0} if devices_per_node is None else {d // devices_per_node for d in devices}
    if len(nodes) > 1:
        raise ValueError(
            f"run.device = 'cuda' with run.devices_per_node = {devices_per_node}: the {len(nodes)} nodes' "
            "agents all run on this host and would put two members on one GPU; leave "
            "run.devices_per_node out, or run each node's agent on its own machine (resihp controller)"
        )
    need = max(local_rank(d, devices_per_node) for d in devices) + 1
    if need > available:
        raise ValueError(f"run.device = 'cuda': the job needs {need} GPUs on this host, it has {available}")


def compute_precision(job: JobSpec, device: torch.device):
    """The context the forward runs in: bf16 autocast, or nothing (fp32)."""
    if job.precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def synchronize(device: torch.device) -> None:
    """Wait for every kernel queued on `device` (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
