"""`resihp-paper` under the exact memory check: Algorithm 1 moves only what fits, and a plan that
does not fit leads to a fallback, not to an abort of the job."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings

from resihp.core import Cluster, Workload, model_preset
from resihp.core.program import compile_plan
from resihp.core.scenario import Job
from resihp.sched import PlanningContext, ResiHP, ResiHPPaper
from resihp.sched.model import chunk_counts, fits_memory, iteration_time, live_bound, plan_memory
from resihp.sched.paper import migration_inputs
from resihp.sched.progress import progress_migrate

from .test_properties import fault_states


def _qwen14b() -> PlanningContext:
    """Table 6's qwen2.5-14b job: TP 4, PP 4, DP 2 on 32 A100-80GB, 8 micro-batches of 16K tokens."""
    job = Job(model_preset("qwen2.5-14b"), Cluster(4, 8, "a100-80g"), Workload(16384, 8), 4, 4, 2)
    return PlanningContext.of_job(job)


def test_eviction_that_fits_no_peer_falls_back_instead_of_aborting():
    """Device 2 dies: its group cannot hold its 12 layers on 3 devices (eq. 3), and the peer stage
    cannot take the 8 evicted chunks (16 K-token activations of two source pipelines do not fit),
    so the first reading aborts; the policy instead takes eq. 3's k_min at one layer, keeps a TP-2
    group with fewer layers, returns a plan that fits and says so."""
    ctx = _qwen14b()
    cluster = ctx.cluster.with_alive(2, False)
    policy = ResiHPPaper()
    with pytest.raises(ValueError, match="no peer can take its work"):
        policy._planned(ctx, cluster, relaxed=False)
    d = policy.adapt(ctx, ctx.home, cluster, [])
    assert not d.aborted and fits_memory(ctx, d.plan)
    assert "k_min at one layer" in d.reason
    first = d.plan.replicas[0][0]
    assert first.tp == 2 and first.num_layers < 12
    assert math.isfinite(d.predicted_iteration_s)


def test_resihp_weighs_the_papers_fallback_plan():
    """`resihp` gets the paper's plan as a candidate there too, and never predicts a slower one."""
    ctx = _qwen14b()
    cluster = ctx.cluster.with_alive(2, False)
    policy = ResiHP(horizon_s=math.inf)
    d = policy.adapt(ctx, ctx.home, cluster, [])
    assert any(label == "paper" for label, _ in d.weighed)
    paper = ResiHPPaper().plan_for(ctx, cluster)
    assert d.predicted_iteration_s <= iteration_time(ctx, paper, cluster, iterations=policy._iterations(ctx))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fault_states())
def test_algorithm1_moves_within_the_exact_memory(state):
    """Algorithm 1 with δ = 0 on the paper's draft under `chunk_memory_check`: the moves give a plan
    whose compiled Program fits (exact live peaks), and at every group the compiled live count is
    at most `live_bound` of the chunks it runs per source, the count the check charges."""
    ctx, cluster = state
    policy = ResiHPPaper(delta=0)
    try:
        draft, speeds = policy._draft(ctx, cluster, relaxed=False)
    except ValueError:
        return
    scale, costs, mem_ok = migration_inputs(ctx, draft, cluster, speeds)
    try:
        moves = progress_migrate(draft, scale, costs, mem_ok, 0)
    except ValueError:
        return  # a lost stage's work fits no peer: the policy's fallbacks take over
    plan = draft.to_plan(moves)
    assert max(plan_memory(ctx, plan).values()) <= max(plan_memory(ctx, plan, exact=False).values())
    assert fits_memory(ctx, plan)
    live = compile_plan(plan).live_peaks()
    for (d, i), by_src in chunk_counts(plan).items():
        if (d, i) in live:
            assert live[(d, i)] <= live_bound(plan.schedule, by_src.values(), i, len(plan.replicas[d]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fault_states())
def test_the_memory_checked_candidates_of_resihp_fit(state):
    """The candidates `resihp` builds under a memory check fit on the live devices: the paper's,
    balance (moves under the exact check), packed (layer caps per group) and every re-split
    variant ("exclude" keeps the running split and is filtered by the check when ranked)."""
    ctx, cluster = state
    try:
        cands = ResiHP().candidates(ctx, ctx.home, cluster)
    except ValueError:
        return
    for label, plan in cands:
        if label in ("paper", "balance", "packed") or label.endswith("+resplit"):
            assert fits_memory(ctx, plan), label


def test_layer_caps_count_only_the_replicas_still_holding_the_stage():
    """llama2-13b at tp 2 / pp 2 / dp 4, one micro-batch per replica: replica 0 and one TP member of
    replica 2's first stage are lost. The optimizer state of a stage shards over the replicas still
    running it (3, not 4), so device 9 alone holds at most 18 layers, not 19: every memory-checked
    candidate fits (a Hypothesis example of the test above)."""
    job = Job(model_preset("llama2-13b"), Cluster(2, 8, "a100-80g"), Workload(4096, 1), 2, 2, 4)
    ctx = PlanningContext.of_job(job)
    cluster = ctx.cluster
    for d in (0, 1, 2, 3, 8):
        cluster = cluster.with_alive(d, False)
    cands = dict(ResiHP().candidates(ctx, ctx.home, cluster))
    assert "balance" in cands
    lone = cands["balance"].replicas[2][0]
    assert lone.devices == (9,) and lone.num_layers <= 18
    for label, plan in cands.items():
        if label in ("paper", "balance", "packed") or label.endswith("+resplit"):
            assert fits_memory(ctx, plan), label
