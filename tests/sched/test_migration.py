"""DP-level adaptation: Algorithm 1 in the progress simulation and our makespan balancing."""

from __future__ import annotations

import math
import random

from resihp.core import Plan, Stage, model_preset
from resihp.sched.exact import exact_bottleneck, ours_bottleneck, random_instance
from resihp.sched.layout import Draft
from resihp.sched.migrate import balance_stage, optimal_stage, stage_bottleneck
from resihp.sched.progress import progress_migrate

TINY = model_preset("tiny")


def _plan(dp=3, pp=4, mbs=3):
    return Plan.uniform(TINY, 1, pp, dp, mbs)


def test_fig6b_progress_migration():
    """Fig. 6b: at slot 2 DP1 lags at stage 0 (P = 2, 1, 2) and delta = 0 moves its pending mb to DP0."""
    plan = _plan()
    scale = {(d, i): 1.0 for d in range(3) for i in range(4)}
    costs = [[1.0, 1.0, 1.0], [1.0, 2.0, 1.0], [1.0, 1.0, 1.0]]  # DP1's second chunk runs long
    moves = progress_migrate(plan, scale, costs, delta=0, affected_only=False)
    assert (1, 2, 0, 0) in moves  # DP1's last micro-batch (global mb 5) runs stage 0 on DP0
    assert all(src == 1 for src, *_ in moves)
    plan.with_changes(assignment=tuple(moves))  # a valid plan: every chunk exactly once


def test_no_migration_when_balanced_or_within_delta():
    """Equal replicas never trigger Algorithm 1, and delta = 1 ignores stage 0's one-chunk gap."""
    plan = _plan()
    scale = {(d, i): 1.0 for d in range(3) for i in range(4)}
    assert progress_migrate(plan, scale, [[1.0] * 3] * 3, delta=0, affected_only=False) == []
    costs = [[1.0, 1.0, 1.0], [1.0, 2.0, 1.0], [1.0, 1.0, 1.0]]
    loose = progress_migrate(plan, scale, costs, delta=1, affected_only=False)
    assert not [m for m in loose if m[2] == 0]
    assert len(loose) < len(progress_migrate(plan, scale, costs, delta=0, affected_only=False))


def test_fig6a_fail_stop_eviction_spreads_work():
    """Fig. 6a: stage 2 of DP1 crashes; all its work goes to DP0 and DP2, no delta test."""
    plan = _plan()
    replicas = [list(r) for r in plan.replicas]
    replicas[1][2] = Stage((), replicas[1][2].layers)
    job = type("J", (), {"model": TINY, "schedule": "1f1b"})()
    draft = Draft(job, tuple(map(tuple, replicas)), (3, 3, 3))
    scale = {(d, i): 1.0 for d in range(3) for i in range(4)}
    scale[(1, 2)] = math.inf
    moves = progress_migrate(draft, scale, [[1.0] * 3] * 3, delta=10)
    evicted = {(s, j): d for s, j, i, d in moves if i == 2 and s == 1}
    assert set(evicted) == {(1, 0), (1, 1), (1, 2)}
    assert set(evicted.values()) == {0, 2}
    draft.to_plan(moves)


def test_memory_blocks_migration():
    """A destination whose memory cannot take one more chunk receives nothing."""
    plan = _plan()
    scale = {(d, i): 1.0 for d in range(3) for i in range(4)}
    costs = [[1.0, 1.0, 1.0], [1.0, 2.0, 1.0], [1.0, 1.0, 1.0]]
    full = lambda g, counts: sum(counts.values()) <= 3  # noqa: E731
    assert progress_migrate(plan, scale, costs, mem_ok=full, delta=0, affected_only=False) == []


def test_balance_picks_chunks_by_cost():
    """Makespan balancing moves the cheap chunks so both groups end near the fluid optimum."""
    scale = {0: 1.0, 1: 2.0}  # group 1 at half speed
    chunks = [(1, (1, j), c) for j, c in enumerate([4.0, 1.0, 1.0])] + [(0, (0, 0), 1.0)]
    where = balance_stage(scale, chunks)
    got = stage_bottleneck(scale, chunks, where)
    assert got == optimal_stage(scale, chunks) == 5.0


def test_makespan_gap_small_instances():
    """On small random instances the heuristic is within 2% of the exact optimum on >= 90% of them."""
    rng = random.Random(7)
    gaps = []
    for _ in range(40):
        inst = random_instance(rng, max_pp=4, max_dp=3, max_mb=9)
        gaps.append(ours_bottleneck(inst) / exact_bottleneck(inst) - 1)
    assert min(gaps) >= -1e-9
    assert sum(g <= 0.02 for g in gaps) >= 0.9 * len(gaps)


def test_affected_only_limits_progress_checks_to_uneven_stages():
    """By default Algorithm 1 moves work only at stages whose replicas run at different speeds."""
    plan = _plan()
    scale = {(d, i): 1.0 for d in range(3) for i in range(4)}
    scale[(1, 1)] = 2.0  # replica 1's stage 1 at half speed
    moves = progress_migrate(plan, scale, [[1.0] * 3] * 3, delta=0)
    assert moves and {i for _, _, i, _ in moves} == {1}
    assert all(src == 1 for src, *_ in moves)
