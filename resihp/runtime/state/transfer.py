"""State transfer between Plan generations: parameters and AdamW moments, resharded on the fly.

Every worker leaves generation g with a `Holding`: its committed shard of parameters and AdamW
moments under the old Plan (no gradients: an iteration in flight is discarded). In generation g+1
the transfer plan (`source_stages`) maps every canonical tensor to one *source stage* of the old
Plan: the first stage, in replica order, that holds it and whose devices are all still members
(itself, or a DP peer's copy when a TP member died). Each source device then broadcasts one flat
buffer with its shards of the tensors it sources, `[param, exp_avg, exp_avg_sq]` per tensor, over
the new world's default group; every member knows every buffer's layout from the old Plan alone.
A receiver gathers the full tensors of its new stage (`gather_tensor`, "copy" mode) and slices its
new shard (`Worker(init=...)`), so TP-split changes, moved layers and devices coming back from
standby are all the same operation. Parameters and moments are bitwise copies: a replan changes
nothing numerically but the order of later floating-point reductions.

Simplest correct, not cheapest: every member receives every buffer (a tiny CPU model moves in
milliseconds); a targeted point-to-point plan is an optimisation left for later. Buffers live on
the member's device (`dev`; a broadcast moves device memory under NCCL); the layouts are computed
on the meta device, so a large model never allocates a full tensor to learn a shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from resihp.core.plan import Plan, Stage
from resihp.model import full_shape, gather_state, gather_tensor, slice_tensor, stage_param_names

MOMENTS = ("exp_avg", "exp_avg_sq")


@dataclass
class Holding:
    """One device's committed state under the old Plan: shard tensors by canonical name."""

    params: dict[str, torch.Tensor]
    moments: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] | None  # None before any step


@dataclass
class StageInit:
    """Full (unsharded) tensors of a new stage's names, and the optimizer step count."""

    params: dict[str, torch.Tensor]
    moments: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] | None
    steps: int


def holding_of(worker) -> Holding:
    """Copy a `Worker`'s parameters and AdamW moments (drops every reference to its groups)."""
    params = {n: p.detach().clone() for n, p in worker.named.items()}
    states = [worker.opt.state.get(p) for p in worker.named.values()]
    if not all(states):
        return Holding(params, None)
    moments = tuple({n: s[k].detach().clone() for n, s in zip(worker.named, states)} for k in MOMENTS)
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


def root_of(device: int, members, holders: dict[int, int] | None) -> int:
    """Who broadcasts `device`'s old shards: itself, or the member keeping its snapshot."""
    return device if device in members or holders is None else holders[device]


def _layout(plan: Plan, sources: dict[str, Stage], device: int) -> list[tuple[str, torch.Size]]:
    """(name, shard shape) of every tensor `device` sources, in canonical order."""
    spec, out = plan.model, []
    for name, st in sources.items():
        if device in st.devices:
            r = st.devices.index(device)
            full = torch.empty(full_shape(spec, name), device="meta")
            out.append((name, slice_tensor(spec, name, full, st.tp_split, st.ffn_split, r).shape))
    return out


def transfer(
    old: Plan,
    holding: Holding | None,
    new: Plan,
    device: int,
    ranks: dict[int, int],
    steps: int,
    snaps: dict[int, Holding] | None = None,
    holders: dict[int, int] | None = None,
    dev: torch.device | None = None,
) -> StageInit | None:
    """Collective over the new world (every member calls it): this device's new stage's state, on
    `dev` (default: the CPU).

    `holding` is this device's state under `old` (None when it held nothing); `steps` the number
    of committed optimizer steps (0: no moments exist yet). Returns None for a standby device.
    `snaps` / `holders` (`snapshot.py`): the snapshots this device keeps, and who keeps whose; a
    lost source device's shards are then broadcast by its holder.
    """
    spec = old.model
    sources = source_stages(old, set(ranks), holders)
    kinds = 1 + (2 if steps > 0 else 0)
    where = new.stage_of(device)
    mine = set()
    if where is not None:
        st_new = new.replicas[where[0]][where[1]]
        mine = set(stage_param_names(spec, st_new.layers))
    pieces: dict[str, list] = {n: [None] * st.tp for n, st in sources.items() if n in mine}
    for src in sorted(d for st in set(sources.values()) for d in st.devices):
        layout = _layout(old, sources, src)
        sizes = [shape.numel() for _, shape in layout]
        root = root_of(src, ranks, holders)
        if root == device:
            held = holding if src == device else (snaps or {}).get(src)
            assert held is not None, f"device {device} sources state of {src} but holds none"
            tensors = [held.params] + (list(held.moments) if kinds > 1 else [])
            buf = torch.cat([t[n].reshape(-1) for n, _ in layout for t in tensors])
        else:
            buf = torch.empty(sum(sizes) * kinds, device=dev)
        dist.broadcast(buf, src=ranks[root])
        offset = 0
        for (name, shape), numel in zip(layout, sizes):
            parts = [buf[offset + k * numel : offset + (k + 1) * numel].view(shape) for k in range(kinds)]
            offset += kinds * numel
            if name in pieces:
                pieces[name][sources[name].devices.index(src)] = parts
    if where is None:
        return None
    full = [{} for _ in range(kinds)]
    for name, per_rank in pieces.items():
        st = sources[name]
        for k in range(kinds):
            full[k][name] = gather_tensor(spec, name, [p[k] for p in per_rank], st.tp_split, st.ffn_split)
    return StageInit(full[0], (full[1], full[2]) if kinds > 1 else None, steps)


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
