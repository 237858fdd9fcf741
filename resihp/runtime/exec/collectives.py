"""TP collectives as autograd functions (Megatron f and g) and a clock that splits compute from comm.

The model takes `enter` and `reduce` callables (see `resihp.model.layers`); `tp_callables` binds
them to one TP process group:

* `reduce` (g): forward all-reduce (sum) of the partial branch output; backward identity, because
  the reduced output is replicated and every rank receives the same upstream gradient.
* `enter` (f): forward identity; backward all-reduce (sum) of the input gradient, because each
  rank's branch contributes only its shard's part of d(loss)/d(x).

Every collective runs inside `CommClock.comm()`, so an instruction's wall time splits into time
blocked in communication and compute-only time (the detector needs the latter: wall time around a
collective hides which rank was slow). On CPU the clock is `perf_counter`. On CUDA, where a
call only queues kernels, it records CUDA events on the current (compute) stream instead: an
instruction's span runs from the event before its first kernel to the event after its last, and a
collective's from the event before it to the event after the compute stream was made to wait for it
(`work.wait()`), so comm time is what the compute stream spent waiting for the collective. The
events are read once per iteration (`resolve`, after the worker synchronised the device).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import contextmanager

import torch
import torch.distributed as dist

from resihp.model import identity


class CommClock:
    """Seconds spent inside `comm()` blocks (CPU: `comm_s`; CUDA: event pairs in `spans`); a disabled
    clock costs one branch. `mark()` is a point in time, `split(a, b)` the (wall, comm) seconds
    between two marks — at once on CPU, after `sync()` on CUDA."""

    def __init__(self, enabled: bool = True, device: torch.device | None = None) -> None:
        self.enabled = enabled
        self.cuda = device is not None and device.type == "cuda"
        self.comm_s = 0.0
        self.spans: list[tuple] = []  # CUDA: (start, end) events of every comm() block

    def reset(self) -> None:
        self.comm_s = 0.0
        self.spans = []

    def _now(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def mark(self) -> tuple:
        """This point: (time or event, comm blocks so far)."""
        return self._now(), self.comm_s if not self.cuda else len(self.spans)

    def split(self, a: tuple, b: tuple) -> tuple[float, float]:
        """(wall, comm) seconds from mark `a` to mark `b`."""
        if not self.cuda:
            return b[0] - a[0], b[1] - a[1]
        comm = sum(s.elapsed_time(e) for s, e in self.spans[a[1] : b[1]]) / 1e3
        return a[0].elapsed_time(b[0]) / 1e3, comm

    def sync(self, mark: tuple) -> None:
        """Wait until the device reached `mark` (a no-op on CPU)."""
        if self.cuda:
            mark[0].synchronize()

    @contextmanager
    def comm(self):
        if not self.enabled:
            yield
            return
        t0 = self._now()
        try:
            yield
        finally:
            if self.cuda:
                self.spans.append((t0, self._now()))
            else:
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
