"""`resihp` under link fail-slows: relinking, re-weighting, the CPU path, and Fig. 9 scenarios."""

from __future__ import annotations

from pathlib import Path

import pytest

from resihp.core.scenario import load_scenario
from resihp.sched import ResiHP
from resihp.sched.links import link_options, link_time, penalty, relink, reweight
from resihp.sched.model import iteration_time
from resihp.sim.compare import simulate_scenario

from .conftest import make_ctx

FIG9 = Path(__file__).resolve().parents[2] / "scenarios" / "paper" / "fig9"


def test_relink_moves_a_pp_pair_off_the_slow_link(ctx):
    """A slow PP pair (TP rank 0 -> TP rank 0) is avoided by re-ranking one group; speeds kept."""
    plan = ctx.home
    a, b = plan.replicas[0][0].devices[0], plan.replicas[0][1].devices[0]
    cluster = ctx.cluster.with_link(a, b, 0.001)
    new = relink(plan, cluster)
    assert penalty(new.replicas, {(min(a, b), max(a, b)): 0.001}) == 0.0
    assert new.devices() == plan.devices()
    assert [sorted(st.devices) for r in new.replicas for st in r] == [
        sorted(st.devices) for r in plan.replicas for st in r
    ]
    assert iteration_time(ctx, new, cluster) < iteration_time(ctx, plan, cluster)


def test_relink_is_identity_without_slow_links(ctx):
    """No slow link: the plan comes back unchanged, and no cost option is set."""
    plan = ctx.home
    assert relink(plan, ctx.cluster) is plan
    assert link_options(ctx.cluster) == {}


def test_relink_across_replicas_takes_a_tp1_pp_link_off_the_pipeline():
    """With TP = 1 no in-group re-ranking exists; the slow link's endpoint trades places with its DP
    peer at the same stage (same layers, same shard): no transfer uses the slow pair any more, every
    stage keeps its layers, and the plan is predicted faster."""
    ctx = make_ctx(tp=1, pp=2, dp=2, mbs=8, nodes=1, gpn=4)
    plan = ctx.home
    a, b = plan.replicas[0][0].devices[0], plan.replicas[0][1].devices[0]
    cluster = ctx.cluster.with_link(a, b, 1e-4)
    new = relink(plan, cluster)
    assert penalty(new.replicas, {(min(a, b), max(a, b)): 1e-4}) == 0.0
    assert [[st.layers for st in r] for r in new.replicas] == [[st.layers for st in r] for r in plan.replicas]
    assert sorted(new.devices()) == sorted(plan.devices()) and new.replicas != plan.replicas
    assert link_time(ctx, new, cluster) < link_time(ctx, plan, cluster)


def test_reweight_gives_the_slow_replica_fewer_microbatches():
    """The replica behind the slow link gets fewer micro-batches (the lever when no relink exists)."""
    ctx = make_ctx(tp=1, pp=2, dp=2, mbs=8, nodes=1, gpn=4)
    plan = ctx.home
    a, b = plan.replicas[0][0].devices[0], plan.replicas[0][1].devices[0]
    cluster = ctx.cluster.with_link(a, b, 1e-4)
    new = reweight(ctx, plan, cluster)
    assert new.microbatches[0] < new.microbatches[1]
    assert sum(new.microbatches) == plan.global_microbatches
    assert link_time(ctx, new, cluster) < link_time(ctx, plan, cluster)


def test_resihp_acts_on_a_slow_link(ctx):
    """`resihp` replaces the plan when a PP link slows, and the new plan is predicted faster."""
    plan = ctx.home
    a, b = plan.replicas[0][0].devices[0], plan.replicas[0][1].devices[0]
    cluster = ctx.cluster.with_link(a, b, 0.001)
    d = ResiHP().adapt(ctx, plan, cluster, [])
    assert d.plan is not plan
    assert d.predicted_iteration_s < link_time(ctx, plan, cluster)
    assert ResiHP().cost_options(cluster) == {"send_blocks": False}


@pytest.mark.parametrize("name", ["llama2-7b-slow-M", "qwen2.5-14b-slow-W"])
def test_resihp_beats_every_baseline_in_fig9(name):
    """Fig. 9 (compute then link fail-slow): `resihp` >= Greyhound, Adaptra and `resihp-paper`."""
    out = simulate_scenario(
        load_scenario(str(FIG9 / f"{name}.toml")), ["greyhound", "adaptra", "resihp-paper", "resihp"], 0
    )
    x = {k: v["samples_per_s"] for k, v in out["policies"].items()}
    assert x["resihp"] >= max(x["greyhound"], x["adaptra"], x["resihp-paper"])
