"""The planning context: what a policy plans for, and that planning starts from its home plan."""

import pytest

from resihp.core import Cluster, Plan, Workload, model_preset
from resihp.core.report import FailureReport
from resihp.sched import PlanningContext, ResiHP, ResiHPPaper

from .conftest import make_ctx


def test_degrees_and_batch_come_from_the_home_plan():
    """A scenario job's context: its uniform plan as home, the degrees and batch of that plan."""
    ctx = make_ctx(tp=4, pp=2, dp=2, mbs=4)
    assert (ctx.tp, ctx.pp, ctx.dp, ctx.global_microbatches, ctx.schedule) == (4, 2, 2, 8, "1f1b")
    assert ctx.home == Plan.uniform(ctx.model, 4, 2, 2, 4)
    with pytest.raises(ValueError, match="home plan device = 16: no such device"):
        PlanningContext(
            Plan.uniform(ctx.model, 4, 2, 2, 4, devices=list(range(1, 17))), ctx.workload, ctx.cluster
        )


@pytest.mark.parametrize("policy_cls", [ResiHP, ResiHPPaper])
def test_groups_come_from_the_home_plan_not_a_uniform_one(policy_cls):
    """A home plan whose TP groups are not the uniform ones (even and odd devices of a node): after
    a fail-stop every group of the new plan lies inside one home group, and healing gives the home
    groups back."""
    model = model_preset("llama2-7b")
    order = [0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15]
    home = Plan.uniform(model, 4, 2, 2, 4, devices=order)  # groups {0, 2, 4, 6}, {1, 3, 5, 7}, ...
    ctx = PlanningContext(home, Workload(4096, 4), Cluster(2, 8))
    groups = {frozenset(st.devices) for stages in home.replicas for st in stages}
    dead = ctx.cluster.with_alive(13, False)
    d = policy_cls().adapt(ctx, home, dead, [FailureReport("fail-stop", (13,))])
    assert 13 not in d.plan.devices()
    for stages in d.plan.replicas:
        for st in stages:
            assert not st.devices or any(set(st.devices) <= g for g in groups), st.devices
    healed = policy_cls().adapt(ctx, d.plan, ctx.cluster, [FailureReport("rejoin", (13,))]).plan
    assert {frozenset(st.devices) for stages in healed.replicas for st in stages} == groups
