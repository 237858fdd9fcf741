"""Which process groups a Plan needs (pure functions of the Plan; no processes)."""

from resihp.core.model_spec import ModelSpec
from resihp.core.plan import Plan, Stage
from resihp.runtime.exec.groups import _group_device_sets, device_ranks, grad_segments

SPEC = ModelSpec("t", 4, 32, 8, 2, 48, 256)


def test_segments_follow_every_replicas_cuts_and_alignment():
    """Replicas cut at layers 1 and 3: three segments; aligned only where all TP splits agree."""
    r0 = (Stage((0, 1), (0, 1), (4, 4), (24, 24)), Stage((2,), (1, 4), (8,), (48,)))
    r1 = (Stage((3, 4), (0, 3), (4, 4), (24, 24)), Stage((5,), (3, 4), (8,), (48,)))
    plan = Plan(SPEC, (r0, r1), (1, 1), "gpipe")
    segs = grad_segments(plan)
    assert [s.layers for s in segs] == [(0, 1), (1, 3), (3, 4)]
    assert [s.devices for s in segs] == [(0, 1, 3, 4), (2, 3, 4), (2, 5)]
    assert [s.aligned for s in segs] == [True, False, True]
    assert segs[0].rank_sets() == [(0, 3), (1, 4)]
    sets = _group_device_sets(plan)
    # TP groups first, then per-segment groups, deduplicated, same order on every rank
    assert sets == [(0, 1), (3, 4), (0, 3), (1, 4), (2, 3, 4), (2, 5)]
    assert sets == _group_device_sets(plan)


def test_ranks_skip_missing_and_standby_devices():
    """Device ids need not be contiguous; standby devices are not in the world."""
    plan = Plan.uniform(SPEC, 1, 2, 1, 2, devices=[3, 7]).with_changes(standby=(5,))
    assert device_ranks(plan) == {3: 0, 7: 1}
    assert _group_device_sets(plan) == []
