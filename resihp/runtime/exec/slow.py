"""Injected fail-slow: occupy the device for t·(1/p − 1) after an instruction's t seconds of compute.

A slow device keeps its compute resource busy longer; it does not hand it to others. So the delay
is work, not sleep: on CPU a busy-wait on `perf_counter` (a sleeping process on shared cores gives
its core away and comes back late: a 10 µs no-op turned into 100 µs, measured on the 2-core
machine); on CUDA a spin kernel (`torch.cuda._sleep`, which spins a given number of GPU clock
cycles) on the compute stream, so every later kernel of the device queues behind it exactly as
behind slow kernels, and the host is not held up. The cycles per second of `_sleep` are measured
once per process (`cycles_per_s`).

On CUDA the instruction's compute time t is not known when its kernels are queued; the spin uses the
same instruction's compute time in the previous iteration (the same program runs every iteration of
a generation) and, the first time, waits for the instruction's end event once. Instructions that did
no work (W under gpipe / 1f1b, where B computed the weight gradients) get nothing.
"""

from __future__ import annotations

import functools
import time

import torch

from .collectives import CommClock


def busy_wait(seconds: float) -> None:
    """Spin on the CPU for `seconds` (never yields the core)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@functools.cache
def cycles_per_s(device_index: int) -> float:
    """GPU clock cycles per second of `torch.cuda._sleep` on this device (median of 5 spins of 10 ms
    nominal; warm-up first, so clocks have ramped up)."""
    with torch.cuda.device(device_index):
        torch.cuda._sleep(1_000_000)
        rates = []
        for _ in range(5):
            cycles = 10_000_000
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            torch.cuda._sleep(cycles)
            b.record()
            b.synchronize()
            rates.append(cycles / (a.elapsed_time(b) / 1e3))
    return sorted(rates)[2]


class Slowdown:
    """The injection of one worker: `after(k, start, p)` right after instruction k's work was queued
    (`start`: the clock's mark before it), at speed factor p < 1."""

    def __init__(self, clock: CommClock, device: torch.device) -> None:
        self.clock, self.device = clock, device
        self.last: dict[int, float] = {}  # instruction index -> its compute seconds, last iteration

    def after(self, k: int, start: tuple, p: float) -> None:
        clock = self.clock
        if not clock.cuda:
            wall, comm = clock.split(start, clock.mark())
            busy_wait(max(wall - comm, 0.0) * (1.0 / p - 1.0))
            return
        t = self.last.get(k)
        if t is None:  # first time: wait for this instruction once
            end = clock.mark()
            clock.sync(end)
            wall, comm = clock.split(start, end)
            t = max(wall - comm, 0.0)
        extra = t * (1.0 / p - 1.0)
        if extra > 0:
            torch.cuda._sleep(int(extra * cycles_per_s(self.device.index)))

    def learn(self, k: int, compute_s: float, p: float) -> None:
        """Instruction k measured `compute_s` in an iteration at speed factor p (1: not slowed); a
        slowed instruction's time includes the delay, t / p, which is taken out again."""
        self.last[k] = compute_s * p
