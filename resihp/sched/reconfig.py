"""What a plan change costs (baselines.md §0 shared defaults), in one place for every policy.

    pause = planning + communicator rebuild (2 s, if any group changed)
            + max over receiving devices of bytes / B_IB,eff + 1.5 s x most layers moved into a group

A device needs a layer's state (14 bytes per parameter of its shard: bf16 weights plus fp32
master, m and v) when it did not hold that layer with the same TP shard before. The source is a
surviving device of an old group that held the layer (same replica preferred), or -1 = the
snapshot of the last completed iteration when no such device is alive.
"""

from __future__ import annotations

import bisect

from resihp.core.plan import Plan
from resihp.cost import memory
from resihp.cost.hardware import hardware_preset

from .base import Reconfig

COMM_REBUILD_S = 2.0  # communicator rebuild (ResiHP Fig. 13: under 2 s)
LAYER_FIXED_S = 1.5  # fixed cost per layer moved (ResiHP Fig. 13: ~15 s for 10 layers)
STATE_BYTES_PER_PARAM = 14  # bf16 weights + fp32 master, m, v (cost-model §2.6)
SNAPSHOT = -1  # transfer source meaning "persisted state of the last completed iteration"
PAPER_PLANNING_S = 1.44  # ResiHP Fig. 13, Qwen 2.5-32B


def _holdings(plan: Plan) -> dict[int, tuple]:
    """device -> (replica, stage, layers, shard signature)."""
    out = {}
    for d, stages in enumerate(plan.replicas):
        for i, st in enumerate(stages):
            for r, dev in enumerate(st.devices):
                out[dev] = (d, i, st.layers, (st.tp_split, st.ffn_split, r))
    return out


def _source(old: Plan, bounds, alive, replica: int, layer: int) -> int:
    order = [replica] + [e for e in range(old.dp) if e != replica] if replica < old.dp else range(old.dp)
    for e in order:
        i = bisect.bisect_right(bounds[e], layer) - 1
        live = [x for x in old.replicas[e][i].devices if alive[x]]
        if live:
            return live[0]
    return SNAPSHOT


def reconfig_cost(ctx, old: Plan, new: Plan, cluster, planning_s: float = 0.0) -> Reconfig:
    """Groups to rebuild, state to move and the pause for switching from `old` to `new`."""
    if old.replicas == new.replicas and old.assignment == new.assignment:
        return Reconfig()
    model = ctx.model
    hw = hardware_preset(cluster.gpu)
    held = _holdings(old)
    bounds = [[st.layers[0] for st in stages] for stages in old.replicas]
    old_groups = {st.devices for stages in old.replicas for st in stages}
    rebuilt, pairs, inbound, moved_into = [], {}, {}, {}
    for d, stages in enumerate(new.replicas):
        p = len(stages)
        for i, st in enumerate(stages):
            if st.hollow:
                continue
            if st.devices not in old_groups:
                rebuilt.append(st.devices)
            for r, dev in enumerate(st.devices):
                sig = (st.tp_split, st.ffn_split, r)
                h = held.get(dev)
                lo, hi = st.layers
                keep = 0
                if h is not None and h[3] == sig:
                    keep = max(0, min(hi, h[2][1]) - max(lo, h[2][0]))
                need = (hi - lo) - keep
                same = h is not None and h[3] == sig
                first_new = i == 0 and not (same and h[1] == 0)
                last_new = i == p - 1 and not (same and h[1] == len(old.replicas[h[0]]) - 1)
                if need == 0 and not first_new and not last_new:
                    continue
                hs, fs = st.tp_split[r] / model.heads, st.ffn_split[r] / model.ffn
                params = need * memory.device_params(model, 1, False, False, st.tp, hs, fs)
                params += memory.device_params(model, 0, first_new, last_new, st.tp)
                nbytes = int(params * STATE_BYTES_PER_PARAM)
                start = lo if not (h and h[3] == sig and h[2][0] <= lo < h[2][1]) else min(h[2][1], hi - 1)
                src = _source(old, bounds, cluster.alive, d, start)
                pairs[(src, dev)] = pairs.get((src, dev), 0) + nbytes
                inbound[dev] = inbound.get(dev, 0) + nbytes
                moved_into[(d, i)] = max(moved_into.get((d, i), 0), need)
    layers_moved = sum(moved_into.values())
    transfer_s = max(inbound.values(), default=0) / hw.inter_bw
    transfer_s += LAYER_FIXED_S * max(moved_into.values(), default=0)
    rebuild_s = COMM_REBUILD_S if rebuilt or old.replicas != new.replicas else 0.0
    return Reconfig(
        rebuilt_groups=tuple(rebuilt),
        transfers=tuple((s, t, b) for (s, t), b in sorted(pairs.items())),
        layers_moved=layers_moved,
        pause_s=planning_s + rebuild_s + transfer_s,
    )
