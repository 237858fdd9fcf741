"""State transfer between Plan generations: parameters and AdamW moments, point to point.

Every worker leaves generation g with a `Holding`: its committed shard of parameters and AdamW
moments under the old Plan (no gradients: an iteration in flight is discarded). In generation g+1
every member first learns who holds what (`inventory`, one small all-gather: its own old shard or
not, and the snapshots of lost devices it keeps, `snapshot.py`), then computes the same transfer
plan (`core.transfer_plan.plan_transfer`, a pure function): for each device of the new Plan, the
row ranges of each tensor of its new stage it lacks and the live copy each comes from (its own,
then its node's, then another node's; senders balanced). Every ordered pair of devices then
exchanges at most one flat buffer — the pair's pieces in the plan's order, `[param, exp_avg,
exp_avg_sq]` per piece — in one `batch_isend_irecv`: tag-free (NCCL ignores tags; one message per
pair and direction needs no matching), and only the ranges that change hands travel, so a
migration-only replan moves nothing and a moved layer moves that layer. The receiver writes each
piece straight into its new shard tensors; no full tensor is materialised. Parameters and moments
are bitwise copies: a replan changes nothing numerically but the order of later floating-point
reductions. A device whose shard is unchanged keeps its own tensors.

A member whose transfer needs a range no live copy covers raises ValueError (every member raises
the same: they computed the same plan); the controller checks the cover before it replans
(`adapt/recovery.py`, `transfer_plan.cover_gaps`), so this means a snapshot it counted on was
lost with a second death during its exchange.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from resihp.core.plan import Plan, Stage
from resihp.core.transfer_plan import (
    ELEMENT_BYTES,
    KINDS,
    TransferPlan,
    extent,
    interval,
    plan_transfer,
    positions,
)
from resihp.model import full_shape, gather_state, stage_param_names

MOMENTS = ("exp_avg", "exp_avg_sq")


@dataclass
class Holding:
    """One device's committed state under the old Plan: shard tensors by canonical name."""

    params: dict[str, torch.Tensor]
    moments: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] | None  # None before any step
    at: int | None = None  # a snapshot's tag: the iteration it is the committed state before


@dataclass
class StageInit:
    """A new stage's tensors by name (full, or this device's shards when `sharded`), and the
    optimizer step count."""

    params: dict[str, torch.Tensor]
    moments: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] | None
    steps: int
    sharded: bool = False  # the tensors are already this device's shards (`transfer`), not full


def holding_of(worker, copy: bool = True) -> Holding:
    """A `Worker`'s parameters and AdamW moments (no reference to its groups): copies, or with
    `copy=False` its own tensors — for a worker about to be dropped, or a reader done with them
    before the next step changes them in place."""
    take = (lambda t: t.detach().clone()) if copy else (lambda t: t.detach())
    params = {n: take(p) for n, p in worker.named.items()}
    states = [worker.opt.state.get(p) for p in worker.named.values()]
    if not all(states):
        return Holding(params, None)
    moments = tuple({n: take(s[k]) for n, s in zip(worker.named, states)} for k in MOMENTS)
    return Holding(params, moments)


def _holds(spec, st: Stage, name: str) -> bool:
    return name in stage_param_names(spec, st.layers)


def source_stages(plan: Plan, members: set[int], holders: dict[int, int] | None = None) -> dict[str, Stage]:
    """Canonical name -> the old stage whose shards provide it (all its devices are members).

    When no complete live copy exists (every replica of a stage lost) and `holders` (device -> the
    member keeping its snapshot, `snapshot.holders`) is given, the first stage whose every device
    is a member or has a live holder; otherwise ValueError naming the tensor.
    """
    spec = plan.model
    out: dict[str, Stage] = {}
    for name in stage_param_names(spec, (0, spec.num_layers)):
        candidates = [
            st
            for stages in plan.replicas
            for st in [next((s for s in stages if not s.hollow and _holds(spec, s, name)), None)]
            if st is not None
        ]
        live = [st for st in candidates if set(st.devices) <= members]
        if not live and holders is not None:
            live = [
                st for st in candidates if all(d in members or holders.get(d) in members for d in st.devices)
            ]
        if not live:
            raise ValueError(f"no live copy of {name}: every stage holding it lost a device")
        out[name] = live[0]
    return out


def inventory(old: Plan, device: int, holding, snaps: dict, ranks: dict[int, int], at: int, dev=None):
    """Collective over the new world: (the members holding their own shard of `old`, lost device
    -> the member keeping its snapshot tagged `at`, the iteration the new generation starts at).
    Every member learns the same, so all plan alike."""
    n = 1 + max([*old.devices(), *ranks])
    mine = torch.zeros(n, dtype=torch.int64, device=dev)
    if holding is not None:
        mine[device] = 1
    for src, snap in snaps.items():
        if snap.at == at:
            mine[src] = 1
    rows = [torch.empty_like(mine) for _ in ranks]
    dist.all_gather(rows, mine)
    by_rank = {r: d for d, r in ranks.items()}
    held = {by_rank[r]: set(row.nonzero().flatten().tolist()) for r, row in enumerate(rows)}
    alive = {d for d, has in held.items() if d in has}
    copies: dict[int, int] = {}
    for d in sorted(held):
        for src in sorted(held[d] - {d} - alive):
            copies.setdefault(src, d)
    return alive, copies


def _views(spec, old_at, piece, held: Holding, kinds: int) -> list[torch.Tensor]:
    """The rows of `piece` in the copy it comes from (`held`: its source's old shard), per kind."""
    st, r = old_at[piece.source]
    axis = extent(spec, piece.name)[0]
    a = interval(spec, piece.name, st, r)[0]
    tensors = [held.params] + (list(held.moments) if kinds > 1 else [])
    return [t[piece.name].narrow(axis, piece.lo - a, piece.hi - piece.lo) for t in tensors]


def transfer(
    old: Plan,
    holding: Holding | None,
    new: Plan,
    device: int,
    ranks: dict[int, int],
    steps: int,
    snaps: dict[int, Holding] | None = None,
    dev: torch.device | None = None,
    node_of=None,
    at: int | None = None,
) -> tuple[StageInit | None, int, TransferPlan]:
    """Collective over the new world (every member calls it): this device's new stage's shards on
    `dev` (default: the CPU; None for a standby device), the bytes it received, and the plan.

    `holding` is this device's state under `old` (None when it held nothing); `steps` the number
    of committed optimizer steps (0: no moments exist yet); `snaps` the snapshots it keeps
    (`snapshot.py`), of which those tagged `at` (the iteration the new generation starts at) count;
    `node_of(device)`: a device's node (default: one node).
    """
    assert ELEMENT_BYTES == 4  # float32 buffers
    spec, snaps = old.model, snaps or {}
    kinds = KINDS if steps > 0 else 1
    alive, copies = inventory(old, device, holding, snaps, ranks, at, dev)
    plan = plan_transfer(old, new, alive, copies, node_of or (lambda d: 0), kinds)
    old_at = positions(old)

    def source(piece):  # (a snapshot lives on the host)
        held = holding if piece.source == device else snaps[piece.source]
        return [v.to(dev) if dev is not None else v for v in _views(spec, old_at, piece, held, kinds)]

    sends: dict[int, list] = {}
    recvs: dict[int, list] = {}
    for p in plan.pieces:
        if p.sender == device and p.receiver != device:
            sends.setdefault(p.receiver, []).append(p)
        elif p.receiver == device and p.sender != device:
            recvs.setdefault(p.sender, []).append(p)
    ops, bufs = [], {}
    for peer, pieces in sorted(sends.items()):
        out = torch.cat([v.reshape(-1) for p in pieces for v in source(p)])
        ops.append(dist.P2POp(dist.isend, out, ranks[peer]))
    for peer, pieces in sorted(recvs.items()):
        bufs[peer] = torch.empty(sum(p.nbytes for p in pieces) // ELEMENT_BYTES, device=dev)
        ops.append(dist.P2POp(dist.irecv, bufs[peer], ranks[peer]))
    for w in dist.batch_isend_irecv(ops) if ops else []:
        w.wait()
    received = sum(b.numel() * b.element_size() for b in bufs.values())
    mine = positions(new).get(device)
    if mine is None:
        return None, received, plan
    into = [p for p in plan.pieces if p.receiver == device]
    if not into:  # the same shard as before: keep it
        return StageInit(holding.params, holding.moments if kinds > 1 else None, steps, True), received, plan
    st, r = mine
    full = [{} for _ in range(kinds)]
    for name in stage_param_names(spec, st.layers):
        shape = list(full_shape(spec, name))
        axis = extent(spec, name)[0]
        a, b = interval(spec, name, st, r)
        shape[axis] = b - a
        for k in range(kinds):
            full[k][name] = torch.empty(shape, device=dev)
    offset = dict.fromkeys(bufs, 0)
    for p in into:
        axis = extent(spec, p.name)[0]
        a = interval(spec, p.name, st, r)[0]
        if p.sender == device:
            parts = source(p)
        else:
            shape = list(full[0][p.name].shape)
            shape[axis] = p.hi - p.lo
            numel = (p.hi - p.lo) * extent(spec, p.name)[2]
            at, buf = offset[p.sender], bufs[p.sender]
            parts = [buf[at + k * numel : at + (k + 1) * numel].view(shape) for k in range(kinds)]
            offset[p.sender] = at + kinds * numel
        for k in range(kinds):
            full[k][p.name].narrow(axis, p.lo - a, p.hi - p.lo).copy_(parts[k])
    assert all(offset[s] == bufs[s].numel() for s in bufs), (device, offset)
    return StageInit(full[0], (full[1], full[2]) if kinds > 1 else None, steps, True), received, plan


def gather_replicas(plan: Plan, shards: dict[int, dict]) -> dict[int, dict[str, torch.Tensor]]:
    """replica -> full state dict, from the TP shards (device -> name -> numpy array) of each of
    its (non-hollow) stages: the final state a job returns."""
    out: dict[int, dict[str, torch.Tensor]] = {}
    for d, stages in enumerate(plan.replicas):
        full: dict[str, torch.Tensor] = {}
        for st in stages:
            if st.hollow:
                continue
            pieces = [{n: torch.from_numpy(a) for n, a in shards[dev].items()} for dev in st.devices]
            full.update(gather_state(plan.model, pieces, st.tp_split, st.ffn_split, "copy"))
        out[d] = full
    return out
