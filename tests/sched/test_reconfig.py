"""Reconfiguration costs: shared constants, state diffs and pauses."""

from __future__ import annotations

import pytest

from resihp.core import Plan, Stage, build_stage
from resihp.core.transfer_plan import plan_transfer, shard_bytes
from resihp.cost.hardware import hardware_preset
from resihp.sched.reconfig import (
    COMM_REBUILD_S,
    LAYER_FIXED_S,
    NODE_COPY,
    OTHER_NODE,
    SNAPSHOT,
    reconfig_cost,
    transfer_s,
)

from .conftest import make_ctx


def test_constants_match_shared_defaults():
    """The baselines.md §0 defaults live in one importable place."""
    assert (COMM_REBUILD_S, LAYER_FIXED_S, SNAPSHOT) == (2.0, 1.5, -1)


def _received(rc) -> dict[int, int]:
    out: dict[int, int] = {}
    for _, dst, nbytes in rc.transfers:
        out[dst] = out.get(dst, 0) + nbytes
    return out


def _runtime_received(old, new, cluster, snapshots=None) -> dict[int, int]:
    """What the runtime's planner call (`resihp plan --json`, runtime/state/transfer.py) moves."""
    alive = [d for d, up in enumerate(cluster.alive) if up]
    return plan_transfer(old, new, alive, snapshots, node_of=cluster.node_of).received


def _with_replica0(plan, stages) -> Plan:
    return plan.with_changes(replicas=(tuple(stages), *plan.replicas[1:]))


def test_same_plan_costs_nothing():
    """Keeping the plan pauses nothing and moves nothing."""
    ctx = make_ctx()
    plan = ctx.home
    rc = reconfig_cost(ctx, plan, plan, ctx.cluster, planning_s=1.0)
    assert rc.pause_s == 0.0 and rc.transfers == () and rc.layers_moved == 0


def test_migration_only_moves_no_state():
    """Moving a micro-batch between replicas needs no state transfer, only planning time: the
    runtime's planner moves 0 bytes too."""
    ctx = make_ctx()
    plan = ctx.home
    moved = plan.with_changes(assignment=((0, 3, 1, 1),))
    rc = reconfig_cost(ctx, plan, moved, ctx.cluster, planning_s=0.5)
    assert rc.transfers == () and rc.pause_s == pytest.approx(0.5)
    assert _runtime_received(plan, moved, ctx.cluster) == {}


def test_shrinking_a_group_reshards_its_layers():
    """A TP-4 group cut to 2 rebuilds its communicator and reshards all its layers from survivors."""
    ctx = make_ctx()
    plan = ctx.home
    cluster = ctx.cluster.with_alive(5, False)
    replicas = [list(r) for r in plan.replicas]
    replicas[0][1] = build_stage(ctx.model, (4, 6), replicas[0][1].layers)
    new = plan.with_changes(replicas=tuple(map(tuple, replicas)), standby=(7,))
    rc = reconfig_cost(ctx, plan, new, cluster, planning_s=0.0)
    assert (4, 6) in rc.rebuilt_groups
    assert {dst for _, dst, _ in rc.transfers} == {4, 6}
    assert all(src not in (5, -1) for src, _, _ in rc.transfers)
    layers = replicas[0][1].num_layers
    assert rc.layers_moved == layers
    assert rc.pause_s >= COMM_REBUILD_S + LAYER_FIXED_S * layers


def test_layers_moved_bytes_are_the_planners():
    """Layer 16 moves from stage 1 to stage 0 of replica 0: devices 0-3 each receive exactly their
    TP shard of that one layer (counted apart by `shard_bytes`), from their own node, as the
    runtime's planner moves it; one layer moved into one group."""
    ctx = make_ctx()
    plan, cluster = ctx.home, ctx.cluster
    st0, st1 = plan.replicas[0]
    new = _with_replica0(
        plan,
        [
            Stage(st0.devices, (0, 17), st0.tp_split, st0.ffn_split),
            Stage(st1.devices, (17, 32), st1.tp_split, st1.ffn_split),
        ],
    )
    rc = reconfig_cost(ctx, plan, new, cluster)
    got = _received(rc)
    assert got == _runtime_received(plan, new, cluster)
    one = Stage(st0.devices, (16, 17), st0.tp_split, st0.ffn_split)
    assert got == {d: shard_bytes(ctx.model, one, r) for r, d in enumerate(st0.devices)}
    assert {src for src, _, _ in rc.transfers} == {NODE_COPY}
    assert rc.layers_moved == 1
    hw = hardware_preset(cluster.gpu)
    assert rc.pause_s == pytest.approx(
        COMM_REBUILD_S + LAYER_FIXED_S + max(got.values()) / hw.intra_bw, rel=0.01
    )


def test_tp_member_excluded_bytes_are_the_planners():
    """Device 5 lost, its group re-split over 4, 6 and 7: each survivor receives the rows its new
    shard adds, the runtime planner's bytes, none from the lost device or the snapshot."""
    ctx = make_ctx()
    plan, cluster = ctx.home, ctx.cluster.with_alive(5, False)
    st1 = plan.replicas[0][1]
    new = _with_replica0(plan, [plan.replicas[0][0], build_stage(ctx.model, (4, 6, 7), st1.layers)])
    rc = reconfig_cost(ctx, plan, new, cluster)
    got = _received(rc)
    assert got == _runtime_received(plan, new, cluster)
    assert set(got) == {4, 6, 7} and all(src not in (5, SNAPSHOT) for src, _, _ in rc.transfers)
    assert rc.layers_moved == st1.num_layers


def test_stage_lost_everywhere_comes_from_the_snapshot():
    """Stage 1 lost in both replicas (devices 4-7, 12-15): the one replica left on 0-3 and 8-11
    takes layers 16-31 from the snapshot (SNAPSHOT); per receiver the bytes the runtime's planner
    moves when peers keep the lost devices' snapshots; priced over the inter-node bandwidth."""
    ctx = make_ctx()
    lost = (4, 5, 6, 7, 12, 13, 14, 15)
    plan, cluster = ctx.home, ctx.cluster
    for d in lost:
        cluster = cluster.with_alive(d, False)
    new = Plan.uniform(ctx.model, 4, 2, 1, 8, plan.schedule, devices=[0, 1, 2, 3, 8, 9, 10, 11])
    rc = reconfig_cost(ctx, plan, new, cluster)
    got = _received(rc)
    snaps = {d: d % 4 for d in lost}  # devices 0-3 (node 0) keep the lost shards
    assert got == _runtime_received(plan, new, cluster, snaps)
    assert {src for src, dst, _ in rc.transfers if dst in (8, 9, 10, 11)} == {SNAPSHOT}
    assert rc.layers_moved == 16
    hw = hardware_preset(cluster.gpu)
    assert transfer_s(rc.transfers, cluster) == pytest.approx(max(got.values()) / hw.inter_bw)


def test_transfer_s_prices_each_link():
    """Bytes from the receiver's node cross NVLink, from other nodes and the snapshot its NIC;
    NVLink and NIC run in parallel; the busiest receiver sets the time."""
    cluster = make_ctx().cluster
    hw = hardware_preset(cluster.gpu)
    b = 10**9
    assert transfer_s([(NODE_COPY, 1, b)], cluster) == pytest.approx(b / hw.intra_bw)
    assert transfer_s([(OTHER_NODE, 1, b)], cluster) == pytest.approx(b / hw.inter_bw)
    assert transfer_s([(OTHER_NODE, 1, b), (SNAPSHOT, 1, b)], cluster) == pytest.approx(2 * b / hw.inter_bw)
    assert transfer_s([(NODE_COPY, 1, 3 * b), (OTHER_NODE, 1, b)], cluster) == pytest.approx(b / hw.inter_bw)
    assert transfer_s([(OTHER_NODE, 1, b), (OTHER_NODE, 2, 2 * b)], cluster) == pytest.approx(
        2 * b / hw.inter_bw
    )
    assert transfer_s([], cluster) == 0.0
