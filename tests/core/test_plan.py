"""Plan construction and validation."""

import pytest

from resihp.core import Plan, Stage, build_stage, even_split, model_preset, split_by_weight

TINY = model_preset("tiny")  # 4 layers, 8 heads


def test_uniform_layout_megatron_order():
    """Plan.uniform puts TP innermost, then PP, then DP, and splits layers evenly, early stages first."""
    m = model_preset("llama2-30b")
    plan = Plan.uniform(m, 4, 8, 2, 16)
    assert plan.replicas[0][0].devices == (0, 1, 2, 3)
    assert plan.replicas[0][1].devices == (4, 5, 6, 7)
    assert plan.replicas[1][0].devices == (32, 33, 34, 35)
    assert [st.num_layers for st in plan.replicas[0]] == [8, 8, 8, 8, 7, 7, 7, 7]
    assert plan.replicas[0][0].tp_split == (13, 13, 13, 13)
    assert plan.global_microbatches == 32 and plan.mb_offset(1) == 16


def test_splits():
    """Weighted splits use largest remainders, keep a floor of one, and sum to the total."""
    assert even_split(10, 3) == (4, 3, 3)
    assert split_by_weight(8, [1, 1, 1]) == (3, 3, 2)
    assert split_by_weight(12, [1, 0.4, 1]) == (5, 2, 5)
    assert sum(split_by_weight(13824, [1, 0.5, 1])) == 13824
    with pytest.raises(ValueError):
        split_by_weight(2, [1, 1, 1])


def test_uneven_tp_stage():
    """A TP-3 stage over 8 heads gets an uneven split proportional to speed."""
    st = build_stage(TINY, (0, 1, 2), (0, 4), speeds=[1.0, 1.0, 0.5])
    assert st.tp_split == (3, 3, 2) and sum(st.ffn_split) == TINY.ffn


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda p: dict(schedule="interleaved"), "parallel.schedule"),
        (lambda p: dict(microbatches=(4,)), "microbatches has 1 entries"),
        (lambda p: dict(standby=(0,)), "standby device 0"),
        (lambda p: dict(assignment=((0, 0, 0, 0),)), "must exist and differ"),
        (lambda p: dict(assignment=((0, 9, 0, 1),)), "no such micro-batch"),
        (lambda p: dict(assignment=((0, 1, 0, 1), (0, 1, 0, 1))), "assigned twice"),
        (lambda p: dict(replicas=(p.replicas[0], p.replicas[0])), "used twice"),
        (
            lambda p: dict(replicas=((Stage((0, 1), (0, 3), (4, 4), (88, 88)),) + p.replicas[0][1:],
                                     p.replicas[1])),
            "must start at 3",
        ),
        (
            lambda p: dict(replicas=((Stage((0, 1), (0, 2), (5, 4), (88, 88)),) + p.replicas[0][1:],
                                     p.replicas[1])),
            "tp_split",
        ),
        (
            lambda p: dict(replicas=((Stage((), (0, 2)),) + p.replicas[0][1:], p.replicas[1])),
            "hollow but micro-batch 0",
        ),
    ],
)  # fmt: skip
def test_invalid_plans_name_the_problem(change, message):
    """Every invalid plan raises one ValueError whose message says what is wrong."""
    plan = Plan.uniform(TINY, 2, 2, 2, 4)
    with pytest.raises(ValueError, match=message):
        plan.with_changes(**change(plan))


def test_migration_needs_same_layers_on_target():
    """A chunk can only move to a replica whose stage holds the same layers."""
    a = Plan.uniform(TINY, 1, 2, 1, 2, devices=[0, 1])
    b = Plan.uniform(TINY, 1, 2, 1, 2, devices=[2, 3], layer_split=(3, 1))
    with pytest.raises(ValueError, match="same layers"):
        Plan(TINY, a.replicas + b.replicas, (2, 2), assignment=((0, 0, 0, 1),))
    ok = Plan(TINY, a.replicas + a.replicas[:0] + Plan.uniform(TINY, 1, 2, 1, 2, devices=[2, 3]).replicas,
              (2, 2), assignment=((0, 0, 0, 1),))  # fmt: skip
    assert ok.executor(0, 0, 0) == 1 and ok.executor(0, 1, 0) == 0


def test_more_stages_than_layers_rejected():
    """Plan.uniform refuses more stages than layers and more TP ranks than heads."""
    with pytest.raises(ValueError, match="parallel.pp = 5"):
        Plan.uniform(TINY, 1, 5, 1, 4)
    with pytest.raises(ValueError, match="parallel.tp = 9"):
        Plan.uniform(TINY, 9, 1, 1, 4)


def test_plan_round_trips_to_dict():
    """to_dict is JSON-ready and lists every stage's devices, layers and split."""
    d = Plan.uniform(TINY, 2, 2, 1, 4).to_dict()
    assert d["replicas"][0][1] == {
        "devices": [2, 3],
        "layers": [2, 4],
        "tp_split": [4, 4],
        "ffn_split": [88, 88],
    }
