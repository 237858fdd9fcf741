"""Pipeline schedules: the one place that says how a stage orders its F, B and W chunks.

A Schedule is the rule every consumer asks: the compiler (`program.compile_plan`) for each group's
chunk order and for the list scheduler of migrated plans, the simulator and the ITP for when the
gradient goes upstream, the runtime worker for whether B and W are separate passes, and the
scheduler's memory model for how many micro-batches a stage keeps live. The live count is read off
the template itself (`live`), so the memory model and the compiled Program cannot disagree.

A chunk is (kind, src, j): kind F=0, B=1 (input gradient), W=2 (weight gradient) of micro-batch j
of source replica `src`. Templates order a group's micro-batches, given sorted by (j, src):

- gpipe: all F, then B/W pairs;
- 1f1b: min(p-1-i, n) warm-up F, then (F, B, W) steps, then (B, W) cool-down; B and W form one
  backward (`split_bw` False), so the gradient goes upstream after W;
- zbh1 (zero-bubble H1): the 1F1B order of F and B, with stage i holding its W chunks back by i
  steps; B computes the input gradient alone (`split_bw`), the gradient goes upstream after B and
  the chain upstream waits only for B. Every stage keeps up to p micro-batches live (1F1B's stage-0
  peak) and the bubble shrinks from (p-1)(F+B+W) to (p-1)(F+B-W) with equal chunk costs.

A template orders *positions*: it may move the (src, j) pairs around but never look at them, so
`Schedule.order` runs it once per (n, stage, num_stages) on placeholders and relabels that pattern
for every group (`_pattern`, cached: a compile orders hundreds of groups of a few shapes).

Adding a schedule: one `Schedule` in SCHEDULES below (its template and list-scheduling
preferences), plus tests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from operator import itemgetter

import numpy as np

F, B, W = 0, 1, 2
KIND_NAMES = ("F", "B", "W")
Chunk = tuple[int, int, int]  # (kind, src replica, micro-batch)
Template = Callable[[Sequence[tuple[int, int]], int, int], list[Chunk]]


def _gpipe(mbs: Sequence[tuple[int, int]], stage: int, num_stages: int) -> list[Chunk]:
    ops: list[Chunk] = [(F, s, j) for s, j in mbs]
    for s, j in mbs:
        ops += [(B, s, j), (W, s, j)]
    return ops


def _one_f_one_b(lag: Callable[[int], int]) -> Template:
    """1F1B's order of F and B; W chunks follow their B after `lag(stage)` further B chunks."""

    def order(mbs: Sequence[tuple[int, int]], stage: int, num_stages: int) -> list[Chunk]:
        n = len(mbs)
        w = min(num_stages - 1 - stage, n)  # warm-up forwards
        held = lag(stage)
        ops: list[Chunk] = [(F, s, j) for s, j in mbs[:w]]
        deferred: list[Chunk] = []
        for k in range(n):
            if w + k < n:
                ops.append((F, *mbs[w + k]))
            ops.append((B, *mbs[k]))
            deferred.append((W, *mbs[k]))
            if len(deferred) > held:
                ops.append(deferred.pop(0))
        return ops + deferred

    return order


@dataclass(frozen=True)
class Schedule:
    """One pipeline schedule.

    `split_bw`: B computes the input gradient only and W the weight gradient in a second pass (the
    graph is kept in between); otherwise B runs the whole backward and W is empty. An unsplit
    backward yields the input gradient only once it is complete, so the gradient goes upstream
    after W; a split one after B (`grad_kind`).

    `list_preference` / `list_w_follows_b`: how the list scheduler of migrated plans
    (`core.listsched`) picks among ready chunks: the kinds in order of preference, and
    whether a W runs right after its B (never queued on its own).
    """

    name: str
    template: Template
    split_bw: bool
    list_preference: tuple[int, ...]
    list_w_follows_b: bool

    @property
    def grad_kind(self) -> int:
        """The chunk after which a stage sends the input gradient upstream."""
        return B if self.split_bw else W

    def order(self, mbs: Sequence[tuple[int, int]], stage: int, num_stages: int) -> list[Chunk]:
        """Chunk order of a group at `stage` of `num_stages` over its (src, j) micro-batches."""
        if not mbs:
            return []
        kinds, take = _pattern(self.name, len(mbs), stage, num_stages)
        srcs, js = zip(*mbs)
        return list(zip(kinds, take(srcs), take(js)))

    def order_arrays(self, n: int, stage: int, num_stages: int) -> tuple[np.ndarray, np.ndarray]:
        """`order` of n micro-batches as read-only int64 arrays (kinds, positions): chunk k is kind
        kinds[k] of the micro-batch at positions[k] of the group's sorted list."""
        return _pattern_arrays(self.name, n, stage, num_stages)

    def live(self, n: int, stage: int, num_stages: int) -> int:
        """Most micro-batches holding activations (F done, W not yet) in the template's order of n
        micro-batches at `stage`: what the compiled Program keeps live, by construction."""
        return _live(self.name, n, stage, num_stages)


@lru_cache(maxsize=1024)
def _pattern(name: str, n: int, stage: int, num_stages: int) -> tuple[tuple[int, ...], Callable]:
    """(kinds, take) of the template's order of n >= 1 micro-batches: chunk k is kind kinds[k] of
    the micro-batch at the k-th position `take` picks from the group's sorted list (3n >= 3
    positions, so `take` always returns a tuple)."""
    ops = SCHEDULES[name].template([(0, q) for q in range(n)], stage, num_stages)
    assert len(ops) == 3 * n, f"template {name!r} must order each micro-batch's F, B and W once"
    return tuple(k for k, _, _ in ops), itemgetter(*(q for _, _, q in ops))


@lru_cache(maxsize=1024)
def _pattern_arrays(name: str, n: int, stage: int, num_stages: int) -> tuple[np.ndarray, np.ndarray]:
    if not n:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    kinds, take = _pattern(name, n, stage, num_stages)
    out = np.array(kinds, dtype=np.int64), np.array(take(range(n)), dtype=np.int64)
    for a in out:
        a.setflags(write=False)
    return out


@lru_cache(maxsize=4096)
def _live(name: str, n: int, stage: int, num_stages: int) -> int:
    peak = live = 0
    for kind in _pattern(name, n, stage, num_stages)[0] if n else ():
        live += 1 if kind == F else (-1 if kind == W else 0)
        peak = max(peak, live)
    return peak


SCHEDULES: dict[str, Schedule] = {
    s.name: s
    for s in (
        Schedule("gpipe", _gpipe, False, (F, B, W), False),
        Schedule("1f1b", _one_f_one_b(lambda stage: 0), False, (B, F), True),
        Schedule("zbh1", _one_f_one_b(lambda stage: stage), True, (B, F, W), False),
    )
}


def get_schedule(name: str) -> Schedule:
    """The Schedule called `name`; ValueError naming the allowed ones otherwise."""
    try:
        return SCHEDULES[name]
    except KeyError:
        raise ValueError(f"parallel.schedule = {name!r}: allowed: {', '.join(SCHEDULES)}") from None
