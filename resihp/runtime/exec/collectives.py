"""TP collectives as autograd functions (Megatron f and g) and a clock that splits compute from comm.

The model takes `enter` and `reduce` callables (see `resihp.model.layers`); `tp_callables` binds
them to one TP process group:

* `reduce` (g): forward all-reduce (sum) of the partial branch output; backward identity, because
  the reduced output is replicated and every rank receives the same upstream gradient.
* `enter` (f): forward identity; backward all-reduce (sum) of the input gradient, because each
  rank's branch contributes only its shard's part of d(loss)/d(x).

Every collective runs inside `CommClock.comm()`, so an instruction's wall time splits into time
blocked in communication and compute-only time (the detector needs the latter: wall time around a
collective hides which rank was slow).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import contextmanager

import torch
import torch.distributed as dist

from resihp.model import identity


class CommClock:
    """Accumulates seconds spent inside `comm()` blocks; disabled clocks cost one branch."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.comm_s = 0.0

    @contextmanager
    def comm(self):
        if not self.enabled:
            yield
            return
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.comm_s += time.perf_counter() - t0


def tp_callables(
    group, clock: CommClock, all_reduce: Callable[..., object] = dist.all_reduce
) -> tuple[Callable, Callable]:
    """(enter, reduce) for a TP group; identities when `group` is None (tp == 1).

    `all_reduce(tensor, group=group)` sums `tensor` in place over the group: torch.distributed's by
    default; the tests pass an in-process one (TP ranks as threads)."""
    if group is None:
        return identity, identity

    def summed(t: torch.Tensor) -> torch.Tensor:
        t = t.contiguous().clone()
        with clock.comm():
            all_reduce(t, group=group)
        return t

    class Enter(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            return summed(grad)

    class Reduce(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return summed(x)

        @staticmethod
        def backward(ctx, grad):
            return grad

    return Enter.apply, Reduce.apply
