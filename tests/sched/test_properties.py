"""Property tests over random clusters, layouts and fault sets (hypothesis)."""

from __future__ import annotations

import math
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from resihp.core.program import F, compile_plan
from resihp.sched import ResiHP, ResiHPPaper
from resihp.sched.model import fits_memory, iteration_time

from .conftest import make_ctx

LAYOUTS = [(4, 2, 2, 2), (2, 2, 4, 2), (4, 4, 2, 4), (8, 2, 1, 2), (2, 4, 2, 2), (1, 4, 4, 2)]


@st.composite
def fault_states(draw):
    tp, pp, dp, nodes = draw(st.sampled_from(LAYOUTS))
    preset = draw(st.sampled_from(["llama2-7b", "qwen2.5-7b", "llama2-13b"]))
    ctx = make_ctx(preset=preset, tp=tp, pp=pp, dp=dp, mbs=draw(st.integers(1, 6)), nodes=nodes)
    n = ctx.cluster.num_devices
    cluster = ctx.cluster
    for d in draw(st.lists(st.integers(0, n - 1), max_size=n // 2, unique=True)):
        cluster = cluster.with_alive(d, False)
    for d in draw(st.lists(st.integers(0, n - 1), max_size=4, unique=True)):
        if cluster.alive[d]:
            cluster = cluster.with_speed(d, draw(st.sampled_from([0.2, 0.4, 0.5, 0.6, 0.9])))
    return ctx, cluster


def _check(ctx, cluster, decision):
    if decision.aborted:
        assert decision.reason.startswith("abort")
        return
    plan = decision.plan
    plan.check_cluster(cluster)  # no dead device, standbys alive
    assert fits_memory(ctx, plan)
    assert plan.global_microbatches == ctx.global_microbatches
    runs = Counter()
    for chunks in compile_plan(plan).chunks.values():
        for kind, src, j in chunks:
            if kind == F:
                runs[(src, j)] += 1
    # every micro-batch runs its forward once per stage: pp chunks in total
    assert set(runs.values()) == {ctx.pp}
    for stages in plan.replicas:
        assert stages[0].layers[0] == 0 and stages[-1].layers[1] == ctx.model.num_layers
    assert math.isfinite(decision.predicted_iteration_s) and decision.reconfig.pause_s >= 0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fault_states())
def test_paper_plans_are_valid(state):
    """resihp-paper returns a valid, memory-feasible plan using only live devices, or aborts clearly."""
    ctx, cluster = state
    _check(ctx, cluster, ResiHPPaper().adapt(ctx, ctx.home, cluster, []))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fault_states())
def test_ours_plans_are_valid_and_not_worse(state):
    """resihp returns a valid plan (or aborts) and never predicts a slower iteration than resihp-paper's
    plan, both priced as resihp prices (the mean over its packed batches)."""
    ctx, cluster = state
    policy = ResiHP(horizon_s=math.inf)
    ours = policy.adapt(ctx, ctx.home, cluster, [])
    _check(ctx, cluster, ours)
    paper = ResiHPPaper().adapt(ctx, ctx.home, cluster, [])
    if not paper.aborted:
        assert not ours.aborted
        theirs = iteration_time(ctx, paper.plan, cluster, iterations=policy._iterations(ctx))
        assert ours.predicted_iteration_s <= theirs * (1 + 1e-9)
