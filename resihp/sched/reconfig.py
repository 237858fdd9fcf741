"""What a plan change costs (baselines.md §0 shared defaults), in one place for every policy.

    pause = planning + communicator rebuild (2 s, if any group changed)
            + transfer_s(the transfer planner's bytes) + 1.5 s x most layers moved into a group

The bytes are the state-transfer planner's (`core.transfer_plan`, which the runtime and `resihp
plan --json` use): the rows of every tensor each device of the new plan lacks, with both fp32
AdamW moments, from the closest live copy of the old plan (its own, then its node, then another
node), or from SNAPSHOT = -1, the persisted state of the last completed iteration, when no live
device holds them (`transfer_volume.inflow`: per receiver, by where the bytes come from). Priced
per receiver: own-node bytes over the intra-node bandwidth, the rest over the inter-node one,
NVLink and NIC in parallel; the transfer lasts as long as its busiest receiver. The planner
spreads the parts over equally close senders, whose load is not priced. A layer is moved into a
group when a member receives any of its tensors; the fixed term counts the group with the most.
"""

from __future__ import annotations

from resihp.core.plan import Plan
from resihp.core.transfer_volume import inflow
from resihp.cost.hardware import hardware_preset

from .base import Reconfig

COMM_REBUILD_S = 2.0  # communicator rebuild (ResiHP Fig. 13: under 2 s)
LAYER_FIXED_S = 1.5  # fixed cost per layer moved (ResiHP Fig. 13: ~15 s for 10 layers)
SNAPSHOT = -1  # transfer source meaning "persisted state of the last completed iteration"
NODE_COPY = -2  # transfer source meaning "a live copy on the receiver's node"
OTHER_NODE = -3  # transfer source meaning "a live copy on another node"
PAPER_PLANNING_S = 1.44  # ResiHP Fig. 13, Qwen 2.5-32B


def transfer_s(transfers, cluster) -> float:
    """Seconds to move `transfers` ((source, receiver, bytes); source NODE_COPY, OTHER_NODE or
    SNAPSHOT) on `cluster`: per receiver, its own-node bytes over the intra-node bandwidth and the
    rest over the inter-node one, NVLink and NIC in parallel; the busiest receiver's time."""
    hw = hardware_preset(cluster.gpu)
    busy: dict[tuple[int, bool], float] = {}
    for src, dst, nbytes in transfers:
        near = src == NODE_COPY
        busy[(dst, near)] = busy.get((dst, near), 0.0) + nbytes / (hw.intra_bw if near else hw.inter_bw)
    return max(busy.values(), default=0.0)


def reconfig_cost(ctx, old: Plan, new: Plan, cluster, planning_s: float = 0.0) -> Reconfig:
    """Groups to rebuild, state to move and the pause for switching from `old` to `new`."""
    if old.replicas == new.replicas and old.assignment == new.assignment:
        return Reconfig()
    alive = [d for d, up in enumerate(cluster.alive) if up]
    got = inflow(old, new, alive, cluster.node_of)
    transfers = tuple(
        (src, dev, n)
        for dev, f in sorted(got.items())
        for src, n in zip((NODE_COPY, OTHER_NODE, SNAPSHOT), f[:3])
        if n
    )
    old_groups = {st.devices for stages in old.replicas for st in stages}
    groups = [st.devices for stages in new.replicas for st in stages if st.devices]
    rebuilt = [g for g in groups if g not in old_groups]
    moved_into = [max((got[d].layers for d in g if d in got), default=0) for g in groups]
    rebuild_s = COMM_REBUILD_S if rebuilt or old.replicas != new.replicas else 0.0
    move_s = transfer_s(transfers, cluster) + LAYER_FIXED_S * max(moved_into, default=0)
    return Reconfig(
        rebuilt_groups=tuple(rebuilt),
        transfers=transfers,
        layers_moved=sum(moved_into),
        pause_s=planning_s + rebuild_s + move_s,
    )
