"""Baseline policies (baselines.md): plans they build and when they give up."""

from collections import Counter

import pytest

from resihp.core.program import compile_plan
from resihp.core.report import FailureReport
from resihp.core.scenario import loads_scenario
from resihp.sched import POLICIES, PlanningContext
from resihp.sched.baselines.common import restart_plan
from resihp.sched.baselines.oobleck import instantiate
from resihp.sched.baselines.recycle import recycle_plan

CTX = PlanningContext.of_job(
    loads_scenario(
        """
[model]
preset = "llama2-13b"
[cluster]
nodes = 4
gpus_per_node = 8
[parallel]
tp = 4
dp = 2
pp = 4
seq_len = 16384
microbatches = 8
"""
    ).job
)


def stop(cluster, *devices):
    for d in devices:
        cluster = cluster.with_alive(d, False)
    return cluster, [FailureReport("fail-stop", (d,)) for d in devices]


def test_recycle_plan_runs_every_chunk_exactly_once():
    """With two dead stage replicas every (micro-batch, stage) still runs once, on a live peer."""
    view, _ = stop(CTX.cluster, 1, 29)  # replica 0 stage 0, replica 1 stage 3
    plan = recycle_plan(CTX, view, (8, 8))
    program = compile_plan(plan)
    seen = Counter()
    for (d, i), chunks in program.chunks.items():
        assert all(view.alive[x] for x in plan.replicas[d][i].devices)
        for kind, src, j in chunks:
            seen[(kind, src, j, i)] += 1
    assert set(seen.values()) == {1}
    assert len(seen) == 3 * 16 * 4
    peers = Counter(dst for src, j, i, dst in plan.assignment)
    assert peers == {1: 8, 0: 8}


def test_recycle_splits_a_dead_stage_evenly_over_peers():
    """With dp = 4 a dead stage's 8 micro-batches go 3/3/2 to the three peers (round-robin)."""
    ctx = PlanningContext.of_job(
        loads_scenario(
            "[model]\npreset = 'llama2-7b'\n[cluster]\nnodes = 4\ngpus_per_node = 8\n"
            "[parallel]\ntp = 4\ndp = 4\npp = 2\nmicrobatches = 8\n"
        ).job
    )
    view, reports = stop(ctx.cluster, 0)
    decision = POLICIES["recycle"]().adapt(ctx, ctx.home, view, reports)
    assert sorted(Counter(a[3] for a in decision.plan.assignment).values()) == [2, 3, 3]
    assert decision.reconfig.pause_s >= 2.0


def test_recycle_aborts_without_a_peer():
    """Both replicas of stage 2 dead: no feasible plan, ReCycle aborts."""
    view, reports = stop(CTX.cluster, 8, 24)
    decision = POLICIES["recycle"]().adapt(CTX, CTX.home, view, reports)
    assert decision.aborted


def test_oobleck_builds_heterogeneous_pipelines():
    """Losing one of 8 TP groups gives pipelines of different depths covering the 7 survivors."""
    view, reports = stop(CTX.cluster, 5)
    plan = instantiate(CTX, view)
    depths = sorted(len(r) for r in plan.replicas)
    assert sum(depths) == 7 and len(set(depths)) > 1
    assert plan.global_microbatches == CTX.global_microbatches
    decision = POLICIES["oobleck"]().adapt(CTX, CTX.home, view, reports)
    assert decision.reconfig.pause_s > 30.0


def test_oobleck_aborts_when_a_layer_is_lost():
    """Once no live group holds some layer, Oobleck (no checkpoints) aborts."""
    view, reports = stop(CTX.cluster, 0, 16)  # stage 0 of both replicas
    decision = POLICIES["oobleck"]().adapt(CTX, CTX.home, view, reports)
    assert decision.aborted


def test_checkpoint_restart_keeps_tp_pp_and_the_global_batch():
    """A restart uses whole pipelines of healthy devices, same TP and PP, same global batch."""
    view, _ = stop(CTX.cluster, 3)
    plan = restart_plan(CTX, view)
    assert plan.dp == 1 and len(plan.replicas[0]) == CTX.pp
    assert all(st.tp == CTX.tp for st in plan.replicas[0])
    assert plan.global_microbatches == CTX.global_microbatches
    assert 3 not in plan.devices()


def test_adaptra_switches_to_the_cpu_path_only_for_slow_links():
    """Adaptra's cost options turn head-of-line blocking off once a slow link is known."""
    adaptra = POLICIES["adaptra"]()
    assert adaptra.cost_options(CTX.cluster) == {}
    assert adaptra.cost_options(CTX.cluster.with_link(0, 4, 0.1)) == {"send_blocks": False}
    decision = adaptra.adapt(CTX, CTX.home, CTX.cluster.with_speed(3, 0.5), [
        FailureReport("fail-slow", (3,), severity=0.5)
    ])  # fmt: skip
    assert decision.plan == CTX.home


def test_strengthened_recycle_reroutes_to_slowed_peers():
    """S-ReCycle re-weights replicas by speed but still reroutes a dead stage to its slowed peer."""
    view, reports = stop(CTX.cluster.with_speed(20, 0.5), 1)
    policy = POLICIES["recycle+greyhound"]()
    decision = policy.adapt(CTX, CTX.home, view, reports)
    plan = decision.plan
    assert {a[3] for a in plan.assignment} == {1}
    assert plan.microbatches[1] < plan.microbatches[0]


@pytest.mark.parametrize("name", [n for n in POLICIES if not n.startswith("resihp")])
def test_policies_ignore_reports_they_cannot_act_on(name):
    """A recovered report on a healthy cluster never aborts a baseline."""
    policy = POLICIES[name]()
    decision = policy.adapt(CTX, CTX.home, CTX.cluster, [FailureReport("recovered", (2,), severity=1.0)])
    assert not decision.aborted
