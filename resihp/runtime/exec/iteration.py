"""One iteration of a worker: what it creates and consumes (`Iteration`), and the elastic
runtime's hooks into it (`Hooks`) — the commit point, the gradient reduction's start, injected
slowness. `exec/worker.py` runs the iteration; `control/member.py` provides the hooks.

Nothing of an iteration waits for the device on the way (a CUDA member's host runs ahead of its
kernels): losses stay tensors until STEP reads them all at once, the timing rows stay marks
(`CommClock`) until the worker resolves them after its one synchronisation at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from resihp.core.trace_format import InstrRow, LinkRow, LossRow
from resihp.core.workload import PackedBatch


def _healthy(it: int) -> float:
    return 1.0


def _no_slow_links(it: int) -> Mapping[int, float]:
    return {}


@dataclass(frozen=True)
class Hooks:
    """The elastic runtime's hooks into each iteration (`control/member.py`); inert by default.

    `before_step(it, losses, wall_s)` runs at STEP before the optimizer: the commit point (it
    raises to abort the iteration). `on_allreduce(it)` runs once per iteration, when the gradient
    reduction begins (a `stop` with phase allreduce). `slow(it)`: the injected speed factor p of
    compute in iteration `it` (1: healthy); `link(it)`: peer device -> injected P2P factor f
    (absent: 1). Both are read once, when the iteration starts.
    """

    before_step: Callable[[int, list[LossRow], float], None] | None = None
    on_allreduce: Callable[[int], None] | None = None
    slow: Callable[[int], float] = _healthy
    link: Callable[[int], Mapping[int, float]] = _no_slow_links


@dataclass
class Iteration:
    """Everything one run of the instruction list creates and consumes, keyed by micro-batch
    (src, j). `run_iteration` makes one and drops it when it returns or raises, so nothing of an
    iteration — a graph, a received tensor, an isend in flight — outlives it."""

    it: int
    batch: PackedBatch  # `workload.pack(it, G)`
    slow: float  # injected compute speed factor p of this iteration
    link: Mapping[int, float]  # peer device -> injected P2P factor f
    t_start: float  # perf_counter when the instruction list started
    mbs: dict = field(default_factory=dict)  # (src, j) -> MicroBatch, built on first use
    live: dict = field(default_factory=dict)  # (src, j) -> [x, out, upstream grad]: F's graph, kept for B/W
    acts: dict = field(default_factory=dict)  # (src, j) -> received activation (N, h), F's input
    grads: dict = field(default_factory=dict)  # (src, j) -> received output gradient (N, h), B's input
    gx: dict = field(default_factory=dict)  # (src, j) -> input gradient (N, h) to send upstream
    sends: list = field(default_factory=list)  # (works, buffer) of isends in flight, waited at ALLREDUCE
    inbox: dict = field(
        default_factory=dict
    )  # (what, src, j) -> (works, buffers, posted time): receives posted
    losses: list[LossRow] = field(
        default_factory=list
    )  # last stage, TP rank 0: (k, loss tensor, n) until STEP
    marks: list = field(
        default_factory=list
    )  # (instruction index, start mark, end mark) of each timed instruction
    rows: list[InstrRow] = field(default_factory=list)  # the trace's `instrs`
    transfers: list[LinkRow] = field(default_factory=list)  # the trace's `links`
    reducing: bool = False  # the gradient reduction began (`Hooks.on_allreduce` ran)
    allreduce_bytes: int = 0  # bytes this device's gradient all-reduces moved (the trace's field)
    grad_norm: float | None = None  # the global gradient norm at STEP (with optim.grad_clip; the trace's)
