"""What STEP needs from other devices before the optimizer runs: the tied embedding's summed
gradient and the global gradient norm (for `optim.grad_clip`).

* Tied embeddings (`ModelSpec.tie_word_embeddings`): the embedding (first stage) and the LM head
  (last stage) are two copies of one matrix. After the segment reduction every holder of either
  has its copy's full gradient; TP rank 0 of the first holder of each (`grad_segments`' order)
  contributes it, and one sum over every holder (`Groups.tie_group`) gives both copies embedding
  use + head use, so equal copies take equal steps and stay bitwise equal.
* Global norm: each device adds, in float64, the squares of the gradient elements it owns alone
  (`optim.owned_names` across replicas, `sharding.owned_sq_sum` inside its TP group), and one
  all-reduce over the plan's devices (`Groups.step_group`) gives ‖g‖² of the whole model, every
  element once. The factor is `optim.clip_coefficient`'s, as the reference computes it on the
  full model. The norm goes into the device's trace record (`grad_norm`).

Both run before the commit point, like any collective of the iteration: a peer's death raises
there and the iteration is aborted, never half applied.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from resihp.core.segments import grad_segments
from resihp.model import owned_sq_sum

from .optim import clip_coefficient

TIED = ("embed.weight", "lm_head.weight")


def tie_embedding_grads(worker) -> None:
    """Replace the gradient of each copy of a tied embedding the worker holds by their sum."""
    names = [n for n in TIED if n in worker.named]
    if not worker.spec.tie_word_embeddings or not names:
        return
    segments, here = grad_segments(worker.plan), (worker.replica, worker.stage_index)
    lead = worker.groups.tp_rank == 0
    total = torch.zeros_like(worker.named[names[0]])
    for name, seg in zip(TIED, (segments[0], segments[-1])):
        if name in worker.named and lead and seg.groups[0] == here:
            total += worker.named[name].grad
    if worker.groups.tie_group is not None:
        with worker.clock.comm():
            dist.all_reduce(total, group=worker.groups.tie_group)
    for name in names:
        worker.named[name].grad = total.clone()


def clipping_scale(worker) -> float:
    """The factor this iteration's gradients are scaled by (1: clipping off or within bound)."""
    clip = worker.job.optim.grad_clip
    if not clip:
        return 1.0
    st, rank = worker.stage, worker.groups.tp_rank
    sq = torch.zeros((), dtype=torch.float64, device=worker.dev)
    for name in worker.norm_names:
        grad = worker.named[name].grad
        sq += owned_sq_sum(worker.spec, name, grad, st.tp_split, st.ffn_split, rank).double()
    if len(worker.plan.devices()) > 1:
        with worker.clock.comm():
            dist.all_reduce(sq, group=worker.groups.step_group)
    worker.now.grad_norm = math.sqrt(float(sq))
    return clip_coefficient(worker.now.grad_norm, clip)
