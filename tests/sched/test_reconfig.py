"""Reconfiguration costs: shared constants, state diffs and pauses."""

from __future__ import annotations

import pytest

from resihp.core import build_stage
from resihp.sched.reconfig import COMM_REBUILD_S, LAYER_FIXED_S, STATE_BYTES_PER_PARAM, reconfig_cost

from .conftest import make_ctx


def test_constants_match_shared_defaults():
    """The baselines.md §0 defaults live in one importable place."""
    assert (COMM_REBUILD_S, LAYER_FIXED_S, STATE_BYTES_PER_PARAM) == (2.0, 1.5, 14)


def test_same_plan_costs_nothing():
    """Keeping the plan pauses nothing and moves nothing."""
    ctx = make_ctx()
    plan = ctx.home
    rc = reconfig_cost(ctx, plan, plan, ctx.cluster, planning_s=1.0)
    assert rc.pause_s == 0.0 and rc.transfers == () and rc.layers_moved == 0


def test_migration_only_moves_no_state():
    """Moving a micro-batch between replicas needs no state transfer, only planning time."""
    ctx = make_ctx()
    plan = ctx.home
    moved = plan.with_changes(assignment=((0, 3, 1, 1),))
    rc = reconfig_cost(ctx, plan, moved, ctx.cluster, planning_s=0.5)
    assert rc.transfers == () and rc.pause_s == pytest.approx(0.5)


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
