"""core.schedule: one Schedule per name, and the compiled Program keeps to what it says."""

import pytest

from resihp.core import SCHEDULES, Plan, model_preset
from resihp.core.program import B, F, W, compile_plan
from resihp.core.schedule import SCHEDULES as REGISTRY
from resihp.core.schedule import get_schedule

MODEL = model_preset("llama2-7b")


def test_registry_is_the_plans_vocabulary():
    """Plan, scenario and train config accept exactly the registry's names; others name them."""
    assert SCHEDULES == tuple(REGISTRY) == ("gpipe", "1f1b", "zbh1")
    with pytest.raises(ValueError, match="allowed: gpipe, 1f1b, zbh1"):
        get_schedule("interleaved")
    with pytest.raises(ValueError, match="parallel.schedule"):
        Plan.uniform(MODEL, 1, 2, 1, 2, "interleaved")


def test_gradient_point_and_split_backward():
    """Only a split backward (zbh1) sends the gradient after B; the others after W."""
    assert {n: (s.split_bw, s.grad_kind) for n, s in REGISTRY.items()} == {
        "gpipe": (False, W),
        "1f1b": (False, W),
        "zbh1": (True, B),
    }


@pytest.mark.parametrize("schedule", list(REGISTRY))
@pytest.mark.parametrize("p,m", [(1, 3), (2, 4), (4, 8), (4, 2), (8, 5), (3, 3), (6, 16)])
def test_live_count_is_what_the_compiled_program_keeps(schedule, p, m):
    """Schedule.live equals the live peak of every compiled group; 1F1B keeps min(p - s, m),
    ZB-H1 min(p, m) on every stage, GPipe all m."""
    program = compile_plan(Plan.uniform(MODEL, 1, p, 2, m, schedule))
    sched = get_schedule(schedule)
    peaks = program.live_peaks()
    for (_, s), peak in peaks.items():
        assert peak == sched.live(m, s, p)
        assert peak == {"gpipe": m, "1f1b": min(p - s, m), "zbh1": min(p, m)}[schedule]


@pytest.mark.parametrize("schedule", list(REGISTRY))
def test_gradient_sent_after_the_schedules_point(schedule):
    """Every gradient SEND follows the Schedule's gradient chunk of the same micro-batch."""
    program = compile_plan(Plan.uniform(MODEL, 1, 3, 1, 4, schedule))
    want = "FBW"[get_schedule(schedule).grad_kind]
    for dev in (1, 2):
        instrs = program.instructions(dev)
        sends = [k for k, x in enumerate(instrs) if x.op == "SEND" and x.what == "grad"]
        assert len(sends) == 4
        assert all(instrs[k - 1].op == want and instrs[k - 1].mb == instrs[k].mb for k in sends)


@pytest.mark.parametrize("schedule", list(REGISTRY))
def test_migrated_sources_stay_within_their_schedule_limit(schedule):
    """The list scheduler of migrated plans keeps at most Schedule.live of each source's chunks live
    per group: the per-source limits come from the Schedule."""
    base = Plan.uniform(MODEL, 1, 3, 2, 6, schedule)
    moves = tuple((0, j, i, 1) for j in (1, 3, 4) for i in (1, 2))
    program = compile_plan(base.with_changes(assignment=moves))
    sched = get_schedule(schedule)
    for g, chunks in program.chunks.items():
        for src in {s for _, s, _ in chunks}:
            n = sum(1 for k, s, _ in chunks if s == src and k == F)
            live = peak = 0
            for kind, s, _ in chunks:
                if s == src:
                    live += 1 if kind == F else (-1 if kind == W else 0)
                    peak = max(peak, live)
            assert peak <= sched.live(n, g[1], 3)
