"""The data-parallel split after faults (split.py) and the candidates of `resihp` built on it."""

from __future__ import annotations

import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from resihp.core import Stage
from resihp.sched import ResiHP
from resihp.sched.layout import packed
from resihp.sched.model import fits_memory, iteration_time
from resihp.sched.split import rate_split, resplit

from .conftest import make_ctx


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.0, 5.0), st.floats(0.1, 3.0)), min_size=1, max_size=3),
    st.integers(3, 10),
)
def test_rate_split_is_the_best_integer_split(replicas, total):
    """The greedy split reaches the smallest latest finish over every split with >= 1 each."""
    fill, slot = [f for f, _ in replicas], [s for _, s in replicas]
    if total < len(replicas):
        return
    got = rate_split(total, fill, slot)
    assert sum(got) == total and min(got) >= 1
    finish = lambda split: max(f + n * s for f, s, n in zip(fill, slot, split))  # noqa: E731
    best = min(
        finish(split)
        for split in itertools.product(range(1, total + 1), repeat=len(replicas))
        if sum(split) == total
    )
    assert finish(got) <= best + 1e-9


def test_resplit_gives_the_replica_that_lost_a_device_fewer_microbatches():
    """After one fail-stop in replica 0's first TP group (its stage runs TP 3), the re-split hands
    replica 0 fewer of the 16 micro-batches, keeps the layout, fits memory and is predicted faster
    than the even split."""
    ctx = make_ctx(mbs=8)
    cluster = ctx.cluster.with_alive(1, False)
    policy = ResiHP()
    plan = next(p for label, p in policy.candidates(ctx, ctx.home, cluster) if label == "exclude")
    new = resplit(ctx, plan, cluster, lambda alone: iteration_time(ctx, alone, cluster))
    assert new.replicas == plan.replicas and new.global_microbatches == 16
    assert new.microbatches[0] < new.microbatches[1]
    assert fits_memory(ctx, new)
    assert iteration_time(ctx, new, cluster) < iteration_time(ctx, plan, cluster)


def test_resihp_takes_a_resplit_plan_after_a_fail_stop():
    """The policy weighs re-split variants of its candidates and, after one fail-stop, runs one:
    uneven micro-batches with the replica that lost a device taking fewer."""
    ctx = make_ctx(mbs=8)
    cluster = ctx.cluster.with_alive(1, False)
    d = ResiHP(horizon_s=math.inf).adapt(ctx, ctx.home, cluster, [])
    assert "+resplit" in d.reason
    assert d.plan.microbatches[0] < d.plan.microbatches[1]
    assert any(label.endswith("+resplit") for label, _ in d.weighed)


def test_packed_gathers_slow_groups_in_the_most_degraded_replica():
    """Three replicas of two stages, one slow group in replica 0 (stage 0) and one in replica 2
    (stage 1): the re-dealt groups put both slow ones in replica 0, the first of the equally
    degraded replicas, moving only the groups they trade places with."""
    speed = {(d, i): 4.0 for d in range(3) for i in range(2)}
    speed[(0, 0)] = speed[(2, 1)] = 3.3
    chosen = {g: (Stage(tuple(range(4 * (2 * g[0] + g[1]), 4 * (2 * g[0] + g[1]) + 4)), (0, 1)), v)
              for g, v in speed.items()}  # fmt: skip
    out = packed(chosen, 3, 2)
    assert out[(0, 0)] == chosen[(0, 0)] and out[(0, 1)] == chosen[(2, 1)]
    assert out[(2, 1)] == chosen[(0, 1)]
    assert all(out[g] == chosen[g] for g in [(1, 0), (1, 1), (2, 0)])
    assert packed({g: (c[0], 4.0) for g, c in chosen.items()}, 3, 2) is None  # nothing slow: no change
