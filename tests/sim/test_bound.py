"""The capacity bound (architecture §5.2): no policy beats X0 · Σ live speed / N.

The bound is recomputed here from the run's fault events alone (which devices are dead or slow
when), not taken from the simulator's own `capacity_bound_samples_per_s`: the test integrates it,
checks the simulator's figure against it, and checks every policy's throughput against it on
average and at every moment of its timeline (both fail today on one scenario, where `resihp`'s
degraded plans beat X0's per-device rate: a known gap of the bound's X0, marked xfail strict so
that its fix shows). X0 itself is checked against the uniform plan's rate (it
must be at least that) and against a roofline no plan can beat (every device computing only the
layers' matmuls at the achieved FLOP rate, no bubble, no communication).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from resihp.cli.demo_cmd import DEMO_SCENARIO
from resihp.core.scenario import load_scenario, loads_scenario
from resihp.cost.flops import linear_flops_per_token
from resihp.cost.hardware import hardware_preset
from resihp.sched import POLICIES
from resihp.sim.compare import simulate_scenario
from resihp.sim.timing import PlanTimer

PAPER = Path(__file__).resolve().parents[2] / "scenarios" / "paper"
FAULT_KINDS = ("stop", "rejoin", "slow", "slow-end", "link", "link-end")


def _scenario(name):
    return loads_scenario(DEMO_SCENARIO) if name == "demo" else load_scenario(str(PAPER / name))


def _capacity_steps(events: list[dict], n: int) -> list[tuple[float, float]]:
    """[(t, Σ live speed / n from t on)] replayed from the fault events of a run."""
    speed, alive = [1.0] * n, [True] * n
    steps = [(0.0, 1.0)]
    for ev in sorted((e for e in events if e["kind"] in FAULT_KINDS), key=lambda e: e["t_s"]):
        kind, dev = ev["kind"], ev.get("device")
        if kind == "stop":
            alive[dev] = False
        elif kind == "rejoin":
            alive[dev], speed[dev] = True, 1.0
        elif kind == "slow":
            speed[dev] = ev["severity"]
        elif kind == "slow-end":
            speed[dev] = 1.0
        steps.append((ev["t_s"], sum(s for s, a in zip(speed, alive) if a) / n))
    return steps


def _at(steps: list[tuple[float, float]], t: float) -> float:
    return [v for s, v in steps if s <= t][-1]


def _mean(steps: list[tuple[float, float]], horizon: float) -> float:
    """Time average over [0, horizon] of a step function [(t, value)]."""
    total = 0.0
    for (t0, v), (t1, _) in zip(steps, [*steps[1:], (horizon, 0.0)]):
        total += v * (min(t1, horizon) - min(t0, horizon))
    return total / horizon


NAMES = ["demo", "fig9/llama2-7b-slow-M.toml", "table6/qwen2.5-14b-stop-2h.toml"]
_RUNS: dict = {}


def _run(name):
    if name not in _RUNS:
        scenario = _scenario(name)
        _RUNS[name] = scenario, simulate_scenario(scenario, sorted(POLICIES), 0)
    return _RUNS[name]


ABOVE = (
    "known gap: X0 is the best healthy plan the built planners find, not the best plan. resihp's "
    "plans on 30, 29 and 28 of the 32 GPUs run above X0 * live/32 (by up to 1.4 %; 1.002 of the bound "
    "over the run): X0's two TP-4 replicas lose 4.5 % to their coupling (gradient all-reduce, waiting "
    "for the slower replica each iteration) where the degraded plan, its micro-batches balanced over "
    "the replicas, loses 3.5 %, and its TP-3 groups run 0.8 % more per device than TP-4 ones"
)


@pytest.mark.parametrize(
    "name", [*NAMES[:2], pytest.param(NAMES[2], marks=pytest.mark.xfail(strict=True, reason=ABOVE))]
)
def test_no_policy_exceeds_the_capacity_bound_on_average(name):
    """Per policy: the simulator's bound equals X0 times the replayed mean capacity, and the
    policy's average throughput stays at or under it."""
    scenario, out = _run(name)
    x0, n, horizon = out["fault_free_samples_per_s"], scenario.job.cluster.num_devices, scenario.duration_s
    for policy, run in out["policies"].items():
        bound = x0 * _mean(_capacity_steps(run["events"], n), horizon)
        assert run["capacity_bound_samples_per_s"] == pytest.approx(bound, rel=1e-5), policy
        assert run["samples_per_s"] <= bound * (1 + 1e-6), policy


@pytest.mark.parametrize(
    "name",
    [
        *NAMES[:2],
        pytest.param(NAMES[2], marks=pytest.mark.xfail(strict=True, reason=(
            "known gap: after the second stop `resihp`'s plan on 30 of 32 GPUs runs 0.45% above "
            "X0 * 30/32: X0, the best healthy plan the built planners find, is not the best one"))),
    ],
)  # fmt: skip
def test_no_policy_exceeds_the_capacity_bound_at_any_moment(name):
    """Every policy's rate stays at or under X0 · capacity(t) at every change of its rate and of
    the capacity."""
    scenario, out = _run(name)
    x0, n = out["fault_free_samples_per_s"], scenario.job.cluster.num_devices
    for policy, run in out["policies"].items():
        steps = _capacity_steps(run["events"], n)
        rates = run["timeline"]
        for t in sorted({t for t, _ in rates} | {t for t, _ in steps}):
            rate = [x for s, x in rates if s <= t][-1] if rates[0][0] <= t else 0.0
            assert rate <= x0 * _at(steps, t) * (1 + 1e-6), (policy, t)


def test_fault_free_rate_lies_between_the_uniform_plan_and_the_roofline():
    """X0 is at least the uniform plan's rate and below every device computing only its share of
    the layers' matmuls at the achieved FLOP rate, with nothing else in the way."""
    scenario, out = _run("table6/qwen2.5-14b-stop-2h.toml")
    job = scenario.job
    x0 = out["fault_free_samples_per_s"]
    assert x0 >= PlanTimer(job, 0).samples_per_s(job.initial_plan(), job.cluster)
    flops_per_sample = 3 * linear_flops_per_token(job.model) * job.workload.seq_len  # F + B + W
    roofline = job.cluster.num_devices * hardware_preset(job.cluster.gpu).achieved_flops / flops_per_sample
    assert x0 < roofline
