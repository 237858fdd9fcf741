"""Fault generators: argument checks, the stop-every kill pattern and W/M/S calibration."""

import pytest

from resihp.core.scenario import loads_scenario
from resihp.sim.faultgen import LEVELS, calibrate, generate, kill_order, pp_link
from resihp.sim.timing import PlanTimer

JOB = loads_scenario(
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
TIMER = PlanTimer(JOB, 0)


def test_unknown_key_and_missing_key_are_named():
    """Generator tables are validated: the message names the key, the value and what is allowed."""
    with pytest.raises(ValueError, match="faults.every_s: unknown key for stop-every"):
        generate(JOB, {"generator": "stop-every", "every_s": 5}, 1e4, TIMER, 0)
    with pytest.raises(ValueError, match="faults.interval_s: missing"):
        generate(JOB, {"generator": "stop-every"}, 1e4, TIMER, 0)
    with pytest.raises(ValueError, match="faults.level = 'X': allowed: W, M, S"):
        generate(JOB, {"generator": "fail-slow", "level": "X"}, 1e4, TIMER, 0)
    with pytest.raises(ValueError, match="faults.generator = 'poisson': unknown"):
        generate(JOB, {"generator": "poisson"}, 1e4, TIMER, 0)


def test_stop_every_is_monotone_down_to_half_of_every_tp_group():
    """The 30-min preset kills one device per event until half the cluster is dead, tp/2 per group."""
    faults = generate(JOB, {"generator": "stop-every", "interval_s": 1800}, 16 * 1800 + 600, TIMER, 0)
    devices = [f.device for f in faults]
    assert len(devices) == len(set(devices)) == JOB.cluster.num_devices // 2
    assert all(f.kind == "stop" for f in faults)
    for stages in JOB.initial_plan().replicas:
        for st in stages:
            assert sum(d in devices for d in st.devices) == JOB.tp // 2
    assert kill_order(JOB, __import__("random").Random(1)) != kill_order(JOB, __import__("random").Random(2))


@pytest.mark.parametrize("level", ["W", "M", "S"])
def test_calibrated_compute_slow_hits_the_level(level):
    """The calibrated speed factor makes the unmitigated throughput drop by 35/55/70% (±2 points)."""
    plan = JOB.initial_plan()
    p = calibrate(JOB, TIMER, LEVELS[level], device=5)
    ratio = TIMER.iteration_s(plan, JOB.cluster) / TIMER.iteration_s(plan, JOB.cluster.with_speed(5, p))
    assert ratio == pytest.approx(1 - LEVELS[level], abs=0.02)


def test_calibrated_link_slow_hits_the_level():
    """A link fail-slow on a stage boundary is calibrated the same way."""
    import random

    link = pp_link(JOB, random.Random(0))
    f = calibrate(JOB, TIMER, LEVELS["M"], link=link)
    plan = JOB.initial_plan()
    ratio = TIMER.iteration_s(plan, JOB.cluster) / TIMER.iteration_s(plan, JOB.cluster.with_link(*link, f))
    assert ratio == pytest.approx(0.45, abs=0.02)


def test_mixed_alternates_stop_and_medium_slow():
    """The mixed pattern alternates fail-stop and fail-slow, with re-joins when asked."""
    faults = generate(
        JOB, {"generator": "mixed", "interval_s": 3600, "rejoin_after_s": 1800}, 5 * 3600, TIMER, 0
    )
    onsets = [f.kind for f in faults if f.kind != "rejoin"]
    assert onsets[:4] == ["stop", "slow", "stop", "slow"]
    assert sum(f.kind == "rejoin" for f in faults) == onsets.count("stop")


def test_llama3_rates_are_seeded_and_consistent():
    """The field-rate generator is deterministic per seed and yields a trace the checker accepts."""
    from resihp.sim.trace import build_trace

    gen = {"generator": "llama3-rates", "stop_rate_per_gpu_h": 2e-3, "slow_rate_per_node_h": 5e-2}
    a = generate(JOB, gen, 48 * 3600, TIMER, 7)
    assert a == generate(JOB, gen, 48 * 3600, TIMER, 7) and len(a) > 3
    build_trace(a, JOB.cluster, 1.0)
