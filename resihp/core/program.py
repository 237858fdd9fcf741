"""Compile a Plan into per-device instruction lists (the paper's "primitives").

Every member of a TP group runs the same list (TP collectives happen inside F and B), so the
Program stores one ordered list of compute chunks per *group* = (replica, stage) and expands it
into full per-device instruction lists (with RECV/SEND/ALLREDUCE/STEP) on demand. Both the
simulator and the runtime read the same Program: the simulator predicts exactly what runs.

A chunk is (kind, src, j): kind F=0, B=1 (input gradient), W=2 (weight gradient) of micro-batch j
of source replica `src`, at the group's stage. Order per group follows the schedule template over
the group's micro-batches sorted by (j, src) (native and migrated-in alike):

- gpipe: all F, then B/W pairs;
- 1f1b: min(p-1-i, n) warm-up F, then (F, B, W) steps, then (B, W) cool-down; B and W form one
  backward, and the gradient goes upstream after W;
- zbh1 (zero-bubble H1): the 1F1B order of F and B, with stage i holding its W chunks back by i
  steps, so the gradient chain upstream waits only for B. Every stage then keeps at most p
  micro-batches live (1F1B's stage-0 peak) and the bubble shrinks from (p-1)(F+B+W) to
  (p-1)(F+B-W) with equal chunk costs.

Plans with migrated chunks take their orders from a unit-time list-scheduling run instead
(`_greedy_orders`), which is deadlock-free by construction.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from .plan import Plan

F, B, W = 0, 1, 2
KIND_NAMES = ("F", "B", "W")
GroupKey = tuple[int, int]  # (replica, stage)
Chunk = tuple[int, int, int]  # (kind, src replica, micro-batch)


@dataclass(frozen=True)
class Instr:
    """One primitive. `op` in F, B, W, SEND, RECV, ALLREDUCE, STEP.

    For SEND/RECV, `what` is "act" or "grad" and `peer` the (replica, stage) group at the other end.
    For ALLREDUCE, `peer` is None and `group` lists the (replica, stage) groups reducing together.
    """

    op: str
    src: int = -1
    mb: int = -1
    stage: int = -1
    what: str = ""
    peer: GroupKey | None = None
    group: tuple[GroupKey, ...] = ()


@dataclass(frozen=True)
class Program:
    plan: Plan
    chunks: dict[GroupKey, list[Chunk]]
    _device_group: dict[int, GroupKey] = field(default_factory=dict, repr=False)
    _cache: dict = field(default_factory=dict, repr=False, compare=False)  # derived, e.g. sim structure

    def group_of(self, device: int) -> GroupKey:
        return self._device_group[device]

    def devices(self, g: GroupKey) -> tuple[int, ...]:
        return self.plan.replicas[g[0]][g[1]].devices

    def grad_group(self, g: GroupKey) -> tuple[GroupKey, ...]:
        """Groups holding the same layer range as g (they all-reduce gradients together)."""
        layers = self.plan.replicas[g[0]][g[1]].layers
        return tuple(h for h in self.chunks if self.plan.replicas[h[0]][h[1]].layers == layers)

    def instructions(self, device: int) -> list[Instr]:
        """The full ordered primitive list of one device."""
        plan = self.plan
        d, i = g = self.group_of(device)
        last = {src: len(plan.replicas[src]) - 1 for src in range(plan.dp)}
        out: list[Instr] = []
        for kind, src, j in self.chunks[g]:
            if kind == F:
                if i > 0:
                    out.append(Instr("RECV", src, j, i, "act", (plan.executor(src, j, i - 1), i - 1)))
                out.append(Instr("F", src, j, i))
                if i < last[src]:
                    out.append(Instr("SEND", src, j, i, "act", (plan.executor(src, j, i + 1), i + 1)))
            elif kind == B:
                if i < last[src]:
                    out.append(Instr("RECV", src, j, i, "grad", (plan.executor(src, j, i + 1), i + 1)))
                out.append(Instr("B", src, j, i))
                if i > 0 and plan.schedule == "zbh1":
                    out.append(Instr("SEND", src, j, i, "grad", (plan.executor(src, j, i - 1), i - 1)))
            else:
                out.append(Instr("W", src, j, i))
                if i > 0 and plan.schedule != "zbh1":
                    out.append(Instr("SEND", src, j, i, "grad", (plan.executor(src, j, i - 1), i - 1)))
        out.append(Instr("ALLREDUCE", stage=i, group=self.grad_group(g)))
        out.append(Instr("STEP", stage=i))
        del d
        return out


def _order(schedule: str, mbs: list[tuple[int, int]], stage: int, num_stages: int) -> list[Chunk]:
    n = len(mbs)
    if schedule == "gpipe":
        ops: list[Chunk] = [(F, s, j) for s, j in mbs]
        for s, j in mbs:
            ops += [(B, s, j), (W, s, j)]
        return ops
    w = min(num_stages - 1 - stage, n)  # warm-up forwards, as in 1F1B
    lag = stage if schedule == "zbh1" else 0  # W chunks held back behind their B
    ops = [(F, s, j) for s, j in mbs[:w]]
    deferred: list[Chunk] = []
    for k in range(n):
        if w + k < n:
            ops.append((F, *mbs[w + k]))
        ops.append((B, *mbs[k]))
        deferred.append((W, *mbs[k]))
        if len(deferred) > lag:
            ops.append(deferred.pop(0))
    return ops + deferred


def _greedy_orders(plan: Plan, work: dict[GroupKey, list[tuple[int, int]]]) -> dict[GroupKey, list[Chunk]]:
    """Orders for plans with migrated chunks, read off a unit-time list-scheduling run.

    Static templates cannot be merged safely when a group serves several source pipelines (its
    1F1B steady state is offset against theirs and the orders can wait on each other in a cycle).
    Instead every group, whenever idle, starts a ready chunk: a B first (its W right after, except
    for zbh1), else an F while fewer than the schedule's limit of *that source pipeline's*
    micro-batches are live, else (zbh1) a deferred W; ties go to the lowest (micro-batch, source).
    The per-source limit lets migrated-in work fill its own pipeline (one shared limit starves both
    pipelines); the extra live activations are the memory cost of migration, which the simulator
    reports in its peak memory. The orders are an actual execution, so the Program is
    deadlock-free under any timing.
    """
    last = [len(st) - 1 for st in plan.replicas]
    limits = {}
    for g in work:
        p = len(plan.replicas[g[0]])
        limits[g] = {"gpipe": 10**9, "1f1b": p - g[1], "zbh1": p}[plan.schedule]
    # Ready chunks per group: F per source replica (heaps of j, so the per-source live limit is
    # cheap to apply), B and W as heaps of (j, src).
    ready_f: dict[GroupKey, dict[int, list[int]]] = {g: {} for g in work}
    ready_bw: dict[GroupKey, tuple[list, list]] = {g: ([], []) for g in work}
    for g, items in work.items():
        if g[1] == 0:
            for j, src in items:
                ready_f[g].setdefault(src, []).append(j)
            for heap in ready_f[g].values():
                heapq.heapify(heap)
    grad_kind = B if plan.schedule == "zbh1" else W
    one_f_one_b = plan.schedule == "1f1b"
    # 1F1B runs each W right after its B (`forced`), so W is never picked on its own there.
    preference = {"gpipe": (F, B, W), "1f1b": (B, F), "zbh1": (B, F, W)}[plan.schedule]
    orders: dict[GroupKey, list[Chunk]] = {g: [] for g in work}
    live: dict[tuple[GroupKey, int], int] = {}  # (group, source replica) -> live micro-batches
    forced: dict[GroupKey, tuple[int, int] | None] = dict.fromkeys(work, None)
    total = sum(3 * len(v) for v in work.values())
    done = 0
    moved = plan._exec  # (src, j, stage) -> executing replica, for migrated chunks only

    def executor(src: int, j: int, i: int) -> int:
        return moved.get((src, j, i), src) if moved else src

    active = {g: None for g in work if g[1] == 0}  # groups that may have work; others wait for a push
    while done < total:
        finished: list[tuple[int, int, int, int]] = []
        for g in list(active):
            key = forced[g]
            kind = W if key else None
            if key is None:
                room = None
                for src, h in ready_f[g].items():
                    if h and (room is None or (h[0], src) < room) and live.get((g, src), 0) < limits[g]:
                        room = (h[0], src)
                for k in preference:
                    key = room if k == F else (ready_bw[g][k - 1][0] if ready_bw[g][k - 1] else None)
                    if key is not None:
                        kind = k
                        break
                if kind is None:
                    del active[g]
                    continue
                if kind == F:
                    heapq.heappop(ready_f[g][key[1]])
                else:
                    heapq.heappop(ready_bw[g][kind - 1])
            else:
                forced[g] = None  # 1F1B: the W of the B just run (never queued)
            j, src = key
            orders[g].append((kind, src, j))
            live[(g, src)] = live.get((g, src), 0) + (1 if kind == F else (-1 if kind == W else 0))
            if kind == B and one_f_one_b:
                forced[g] = key
            finished.append((kind, src, j, g[1]))
        assert finished, "list scheduling stalled: no group could start a chunk"
        done += len(finished)
        for kind, src, j, i in finished:
            if kind == F:
                if i < last[src]:
                    nxt = (executor(src, j, i + 1), i + 1)
                    heapq.heappush(ready_f[nxt].setdefault(src, []), j)
                    active[nxt] = None
                else:
                    heapq.heappush(ready_bw[(executor(src, j, i), i)][B - 1], (j, src))
            elif kind == B and not one_f_one_b:
                heapq.heappush(ready_bw[(executor(src, j, i), i)][W - 1], (j, src))
            if kind == grad_kind and i > 0:
                up = (executor(src, j, i - 1), i - 1)
                heapq.heappush(ready_bw[up][B - 1], (j, src))
                active[up] = None
    return orders


def compile_plan(plan: Plan) -> Program:
    """Per-group ordered chunk lists for `plan.schedule`."""
    work: dict[GroupKey, list[tuple[int, int]]] = {}
    for d, stages in enumerate(plan.replicas):
        for i, st in enumerate(stages):
            if not st.hollow:
                work[(d, i)] = []
    for src, stages in enumerate(plan.replicas):
        for j in range(plan.microbatches[src]):
            for i in range(len(stages)):
                work[(plan.executor(src, j, i), i)].append((j, src))
    for items in work.values():
        items.sort()
    if plan.assignment:
        chunks = _greedy_orders(plan, work)
    else:
        chunks = {
            g: _order(plan.schedule, [(s, j) for j, s in items], g[1], len(plan.replicas[g[0]]))
            for g, items in work.items()
        }
    device_group = {dev: g for g in work for dev in plan.replicas[g[0]][g[1]].devices}
    return Program(plan, chunks, device_group)
