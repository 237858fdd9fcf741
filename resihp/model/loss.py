"""The project's single loss convention (every executor must use these two functions).

The loss backpropagated for one micro-batch is `sum of token cross-entropies / (G * seq_len)`,
with G the number of micro-batches in the iteration's *global* batch. An iteration's gradient is
then the plain sum of its micro-batches' gradients, whichever replica ran them, so it cannot depend
on how micro-batches are spread over data-parallel replicas (nor on a re-plan mid-iteration).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def microbatch_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    num_microbatches: int,
    seq_len: int,
    num_targets: int | None = None,
) -> tuple[torch.Tensor, int]:
    """(loss to backpropagate, number of non-ignored targets) for logits (N, V) and targets (N,).
    `num_targets`: that number when the caller has it from host data (counting a device tensor
    waits for the device)."""
    ce = F.cross_entropy(logits.float(), targets, ignore_index=IGNORE_INDEX, reduction="sum")  # ()
    if num_targets is None:
        num_targets = int((targets != IGNORE_INDEX).sum())
    return ce / (num_microbatches * seq_len), num_targets


def iteration_loss(loss_sum: float, num_microbatches: int, seq_len: int, num_targets: int) -> float:
    """Mean cross-entropy per target token from the sum of an iteration's micro-batch losses."""
    return loss_sum * num_microbatches * seq_len / max(num_targets, 1)
