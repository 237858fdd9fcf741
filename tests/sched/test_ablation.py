"""`resihp-paper` with components switched on one at a time (the Fig. 11 ablation)."""

from __future__ import annotations

import pytest

from resihp.sched import ResiHPPaper
from resihp.sched.model import fits_memory


def _layers(plan):
    return [tuple(st.num_layers for st in r) for r in plan.replicas]


def test_components_are_validated():
    """Unknown or empty component sets are the user's error."""
    with pytest.raises(ValueError, match="components"):
        ResiHPPaper(components=("DE", "XX"))
    with pytest.raises(ValueError, match="components"):
        ResiHPPaper(components=())


def test_full_components_equal_the_default(ctx):
    """("DE", "LR", "WM") in any order is the paper's policy."""
    cluster = ctx.cluster.with_speed(5, 0.4).with_alive(9, False)
    a = ResiHPPaper().plan_for(ctx, cluster)
    b = ResiHPPaper(components=("WM", "DE", "LR")).plan_for(ctx, cluster)
    assert a == b


def test_de_only_keeps_the_initial_split_and_does_not_balance(ctx):
    """DE alone: eq. 4 groups, the job's initial layer split, no migration between live groups."""
    cluster = ctx.cluster.with_speed(5, 0.4)
    plan = ResiHPPaper(components=("DE",)).plan_for(ctx, cluster)
    assert _layers(plan) == _layers(ctx.home)
    assert plan.replicas[0][1].devices == (4, 6)
    assert plan.assignment == ()


def test_lr_repartitions_and_wm_migrates(ctx):
    """DE+LR re-splits layers uniformly without moves; adding WM adds Algorithm 1's moves."""
    cluster = ctx.cluster.with_speed(5, 0.4)
    lr = ResiHPPaper(delta=0, components=("DE", "LR")).plan_for(ctx, cluster)
    assert _layers(lr) != _layers(ctx.home) and len(set(_layers(lr))) == 1
    assert lr.assignment == ()
    wm = ResiHPPaper(delta=0, components=("DE", "LR", "WM")).plan_for(ctx, cluster)
    assert _layers(wm) == _layers(lr) and wm.assignment


def test_without_de_a_damaged_group_is_dropped_and_its_work_evicted(ctx):
    """No DE: a group that lost a member runs nothing; every chunk of it moves to a live peer."""
    cluster = ctx.cluster.with_alive(5, False)
    plan = ResiHPPaper(components=("LR", "WM")).plan_for(ctx, cluster)
    assert plan.replicas[0][1].hollow
    moved = [a for a in plan.assignment if a[0] == 0 and a[2] == 1]
    assert len(moved) == plan.microbatches[0] and all(a[3] != 0 for a in moved)
    assert fits_memory(ctx, plan)
