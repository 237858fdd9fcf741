"""The controller's replanning rules and the transfer plan, without processes."""

import pytest

from resihp.core.model_spec import ModelSpec
from resihp.core.plan import Plan
from resihp.runtime.adapt.reconfig import rebalance_slow, shrink_plan
from resihp.runtime.state.transfer import source_stages

SPEC = ModelSpec("t", 4, 32, 8, 2, 48, 256)
PLAN = Plan.uniform(SPEC, 2, 2, 2, 2)  # replica 0: (0,1) (2,3); replica 1: (4,5) (6,7)


def test_shrink_plan_keeps_tp_survivors_or_drops_the_replica():
    """A lost TP member shrinks its stage; a lost stage drops its replica, keeps the global batch."""
    p = shrink_plan(PLAN, {5})
    assert p.replicas[1][0].devices == (4,) and p.replicas[1][0].tp_split == (8,)
    assert p.replicas[0] == PLAN.replicas[0] and p.microbatches == (2, 2)
    p = shrink_plan(PLAN, {6, 7})
    assert p.dp == 1 and p.microbatches == (4,) and p.standby == (4, 5)
    p = shrink_plan(PLAN, {1, 6, 7})
    assert p.dp == 1 and p.replicas[0][0].devices == (0,) and p.global_microbatches == 4
    with pytest.raises(ValueError, match="every replica"):
        shrink_plan(PLAN, {0, 1, 6, 7})


def test_source_stages_prefer_a_complete_live_copy():
    """Every tensor comes from a stage whose devices all live: a DP peer's when a TP member died."""
    src = source_stages(PLAN, set(range(8)) - {5})
    assert src["embed.weight"].devices == (0, 1) and src["layers.1.attn.wq"].devices == (0, 1)
    src = source_stages(PLAN, set(range(8)) - {1})
    assert src["layers.0.attn.wq"].devices == (4, 5) and src["lm_head.weight"].devices == (2, 3)
    with pytest.raises(ValueError, match="no live copy of layers.2"):
        source_stages(PLAN, set(range(8)) - {2, 7})


def test_rebalance_slow_shifts_heads_off_the_slow_member():
    """The slow member of a TP stage gets fewer heads and FFN columns; a TP-1 stage cannot rebalance."""
    p = rebalance_slow(PLAN, 1, 0.25)
    st = p.replicas[0][0]
    assert st.devices == (0, 1)
    assert st.tp_split[1] < st.tp_split[0] and st.ffn_split[1] < st.ffn_split[0]
    assert rebalance_slow(shrink_plan(PLAN, {5}), 4, 0.25) is None
    assert rebalance_slow(PLAN, 3, 0.99) is None  # too mild to move a head


def test_rebalance_slow_remembers_every_known_speed():
    """A later report on the fast peer re-splits with both estimates, not the new one alone: the
    slow member never gets more heads than its peer."""
    first = rebalance_slow(PLAN, 1, 0.25)
    later = rebalance_slow(first, 0, 0.6, known={1: 0.25, 0: 0.6})
    st = later.replicas[0][0]
    assert st.tp_split[1] < st.tp_split[0] and st.ffn_split[1] < st.ffn_split[0]
    forgetful = rebalance_slow(first, 0, 0.6).replicas[0][0]
    assert forgetful.tp_split[1] > forgetful.tp_split[0]  # what the old rule did


def test_replan_after_slow_takes_the_policys_plan_or_says_why_not():
    """A slow device in a TP-1 stage: the resihp policy moves work off it (no rule could); a slow PP
    link: the policy (on the `cpu` preset or on a calibrated Hardware) takes the link off the
    pipelines; a slow link no transfer uses: the policy would switch to its plan without the
    report too (`Decision.prompted` false), so no replan; policy None: the rule (TP-2 stage
    re-split, nothing for TP 1). One `adapt` call per replan."""
    from resihp.core.report import FailureReport
    from resihp.core.workload import Workload
    from resihp.cost import hardware_preset
    from resihp.runtime.adapt.reconfig import planning_context, replan_after_slow
    from resihp.sched import ResiHP

    class Counted(ResiHP):
        calls = 0

        def decide(self, *args):
            Counted.calls += 1
            return super().decide(*args)

    wl = Workload(32, 2)
    pp = Plan.uniform(SPEC, 1, 2, 2, 2)  # replica 0: 0 -> 1, replica 1: 2 -> 3
    ctx = planning_context(pp, wl)
    slow = [FailureReport("fail-slow", (1,), severity=0.25)]
    new, why = replan_after_slow(ctx, pp, {0, 1, 2, 3}, Counted(), {1: 0.25}, {}, slow)
    assert Counted.calls == 1
    assert why.startswith("resihp: ") and set(new.devices()) <= {0, 1, 2, 3}
    assert new.global_microbatches == 4 and (new.replicas, new.assignment) != (pp.replicas, pp.assignment)
    i = new.stage_of(1)[1]
    on_1 = sum(new.executor(src, j, i) == 0 for src in range(2) for j in range(2))
    assert new.replicas[0][i].num_layers * on_1 < 2 * 2  # less work than its 2 layers x 2 micro-batches
    assert replan_after_slow(ctx, pp, {0, 1, 2, 3}, None, {1: 0.25}, {}, slow) == (
        None, "no rule for this failure (a TP-1 stage or a link): no replan",
    )  # fmt: skip
    link = [FailureReport("link-slow", (0, 1), (0, 1), severity=0.25)]
    calibrated = hardware_preset("cpu").with_changes(p2p_bw=5e5, layer_overhead_s=1e-3)
    for hw in (None, calibrated):
        on = planning_context(pp, wl, hardware=hw)
        new, why = replan_after_slow(on, pp, {0, 1, 2, 3}, Counted(), {}, {(0, 1): 0.25}, link)
        assert why.startswith("resihp: ") and "relink" in why, why
        assert all({a.devices[0], b.devices[0]} != {0, 1} for a, b in new.replicas)
    unused = [FailureReport("link-slow", (0, 3), (0, 3), severity=0.25)]  # neither a PP nor a DP pair
    new, why = replan_after_slow(ctx, pp, {0, 1, 2, 3}, Counted(), {}, {(0, 3): 0.25}, unused)
    assert new is None and "without these reports" in why and why.endswith("no replan")
    assert Counted.calls == 4
    new, why = replan_after_slow(planning_context(PLAN, wl), PLAN, set(range(8)), None, {1: 0.25}, {}, slow)
    assert new == rebalance_slow(PLAN, 1, 0.25) and why.startswith("rebalance")
