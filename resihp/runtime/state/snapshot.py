"""In-memory snapshots of the committed state on a peer: the source of last resort (issue 7).

With `run.snapshots`, every plan device keeps a copy of one *buddy*'s committed shard (parameters
and AdamW moments) in its memory. The buddy map (`holders`) is a function of the Plan alone: the
stages, listed stage-major (stage index, then replica), hand their shards to the stage `dp`
positions further on in that list, skipping stages with the same stage index, i.e. a stage that
holds other layers (another pipeline stage of the same or another replica) — so one lost stage
index (every replica of it) never takes its snapshot with it. TP rank t sends to rank t mod tp'.

`exchange` refreshes the snapshots: once when a generation starts (after the state transfer), and
after every committed optimizer step, by point-to-point sends on the generation's default group
(one `batch_isend_irecv`, no tags: at most one buffer travels each way between two devices, and no
pipeline block is in flight between iterations), on the members' device —
for the tiny CPU model a few hundred kB per device and iteration. Snapshots are therefore always
the state of the last committed iteration under the current Plan, and `transfer` can use a holder
in place of a lost source device (`transfer.source_stages(..., holders)`): the run continues
without restart and without losing an iteration. Refreshing every k > 1 commits would need a
rollback of the whole job to the snapshot's iteration; not built.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from resihp.core.plan import Plan
from resihp.model import full_shape, slice_tensor, stage_param_names

from .transfer import Holding


def holders(plan: Plan) -> dict[int, int]:
    """device -> the device that keeps its snapshot (devices without one are absent)."""
    stages = sorted(
        (i, r) for r, sts in enumerate(plan.replicas) for i, st in enumerate(sts) if not st.hollow
    )
    out: dict[int, int] = {}
    off = max(1, len(plan.replicas))
    for j, (i, r) in enumerate(stages):
        order = [stages[(j + off + k) % len(stages)] for k in range(len(stages))]
        other = [s for s in order if s[0] != i] or [s for s in order if s != (i, r)]
        if not other:
            continue
        i2, r2 = other[0]
        st, st2 = plan.replicas[r][i], plan.replicas[r2][i2]
        for t, dev in enumerate(st.devices):
            out[dev] = st2.devices[t % len(st2.devices)]
    return out


def _layout(plan: Plan, device: int) -> list[tuple[str, torch.Size]]:
    """(name, shard shape) of `device`'s stage tensors, in canonical order."""
    r, i = plan.stage_of(device)
    st = plan.replicas[r][i]
    t = st.devices.index(device)
    spec = plan.model
    return [
        (
            n,
            slice_tensor(
                spec, n, torch.empty(full_shape(spec, n), device="meta"), st.tp_split, st.ffn_split, t
            ).shape,
        )
        for n in stage_param_names(spec, st.layers)
    ]


def exchange(plan: Plan, device: int, ranks: dict[int, int], holding: Holding) -> dict[int, Holding]:
    """Send this device's committed shard to its holder, receive the shards it holds; collective over
    the plan's devices (standby members do not call it). Returns {source device: Holding}."""
    hold = holders(plan)
    kinds = 1 if holding.moments is None else 3
    dev = next(iter(holding.params.values())).device
    ops, bufs = [], {}
    for src in sorted(d for d, h in hold.items() if h == device):
        numel = sum(s.numel() for _, s in _layout(plan, src))
        bufs[src] = torch.empty(numel * kinds, device=dev)
        ops.append(dist.P2POp(dist.irecv, bufs[src], ranks[src]))
    if device in hold:
        tensors = [holding.params] + (list(holding.moments) if kinds > 1 else [])
        out = torch.cat([t[n].reshape(-1) for n, _ in _layout(plan, device) for t in tensors])
        ops.append(dist.P2POp(dist.isend, out, ranks[hold[device]]))
    for w in dist.batch_isend_irecv(ops) if ops else []:
        w.wait()
    snaps = {}
    for src, buf in bufs.items():
        parts: list[dict[str, torch.Tensor]] = [{} for _ in range(kinds)]
        offset = 0
        for name, shape in _layout(plan, src):
            for k in range(kinds):
                parts[k][name] = buf[offset : offset + shape.numel()].view(shape).clone()
                offset += shape.numel()
        snaps[src] = Holding(parts[0], (parts[1], parts[2]) if kinds > 1 else None)
    return snaps
