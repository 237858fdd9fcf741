"""The list scheduler's executor table, its run per component and the per-Plan gradient-segment
memo (issue 12's replan latency work): each must answer exactly what the plan says, also for
derived plans."""

from __future__ import annotations

import random

import numpy as np
import pytest

from resihp.core import Plan, model_preset
from resihp.core.listsched import _executors, _run, list_schedule
from resihp.core.program import _work
from resihp.core.segments import _grad_segments, grad_segments

TINY = model_preset("tiny")


def _migrated() -> Plan:
    plan = Plan.uniform(TINY, 1, 4, 3, 3)
    # replica 1's micro-batch 2 runs stage 0 on replica 0, its micro-batch 0 stage 3 on replica 2
    return plan.with_changes(assignment=((1, 2, 0, 0), (1, 0, 3, 2)))


def test_executor_table_names_the_group_of_every_chunk_stage_and_pads_with_minus_one():
    plan = _migrated()
    work = _work(plan)
    index = {g: k for k, g in enumerate(work)}
    at = _executors(plan, index)
    dp, w1 = plan.dp, max(len(s) for s in plan.replicas) + 1
    for src, stages in enumerate(plan.replicas):
        for j in range(plan.microbatches[src]):
            c = j * dp + src
            for i in range(len(stages)):
                assert at[c * w1 + i] == index[(plan.executor(src, j, i), i)]
            assert at[c * w1 + len(stages)] == -1  # past the last stage
            assert at[c * w1 - 1] == -1  # stage -1: the previous slot's padding (or the last one)
    assert at[w1 * (2 * dp + 1) + 0] == index[(0, 0)]  # the moved chunk (1, 2) at stage 0
    assert at[w1 * (0 * dp + 1) + 3] == index[(2, 3)]  # the moved chunk (1, 0) at stage 3


def test_grad_segments_memo_is_per_plan_object():
    plan = _migrated()
    first = grad_segments(plan)
    assert grad_segments(plan) is first and first == _grad_segments(plan)
    other = plan.with_changes(replicas=plan.replicas[:2], microbatches=plan.microbatches[:2], assignment=())
    assert grad_segments(other) == _grad_segments(other) != first  # a derived plan: computed anew


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "zbh1"])
def test_run_per_component_and_memoised_untouched_replicas_equal_the_joint_run(schedule):
    """Orders and rounds per group are the joint run's (`_run` over every group at once) when
    the moves join some replicas and leave others alone (those come from the memo by shape)."""
    rng = random.Random(7)
    for _ in range(6):
        dp, pp = rng.randint(3, 5), rng.randint(2, 4)
        m = rng.randint(1, 6)
        plan = Plan.uniform(TINY, 1, pp, dp, m, schedule=schedule)
        joined = rng.sample(range(dp), 2)  # the others stay untouched
        moves = {(joined[0], rng.randrange(m), rng.randrange(pp)): joined[1] for _ in range(3)}
        plan = plan.with_changes(assignment=tuple((*k, d) for k, d in moves.items()))
        _equals_the_joint_run(plan)


def test_two_components_each_with_a_replica_that_moved_everything_away():
    """Replicas 0 and 1 lost their devices and run every micro-batch on 2 and 3 respectively: two
    components, each with a move whose executor the other lacks (a Hypothesis example: the
    per-component executor table looked up the other component's executor and raised KeyError)."""
    plan = Plan.uniform(TINY, 1, 1, 4, 1, schedule="gpipe")
    _equals_the_joint_run(plan.with_changes(assignment=((0, 0, 0, 2), (1, 0, 0, 3))))


def _equals_the_joint_run(plan: Plan) -> None:
    """`list_schedule`'s orders and rounds per group are `_run`'s over every group at once, read-only."""
    work = _work(plan)
    arrays, rounds = list_schedule(plan, work)
    want_a, want_r = _run(plan, work)
    assert list(arrays) == list(want_a) == list(work)
    for g in work:
        assert np.array_equal(arrays[g], want_a[g]) and np.array_equal(rounds[g], want_r[g]), g
        assert not arrays[g].flags.writeable and not rounds[g].flags.writeable
