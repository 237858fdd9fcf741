"""The capacity bound (architecture §5.2): no policy beats X0 · Σ live speed / N."""

from __future__ import annotations

from pathlib import Path

import pytest

from resihp.cli.demo_cmd import DEMO_SCENARIO
from resihp.core.scenario import load_scenario, loads_scenario
from resihp.sched import POLICIES
from resihp.sim.compare import simulate_scenario
from resihp.sim.timing import PlanTimer

PAPER = Path(__file__).resolve().parents[2] / "scenarios" / "paper"


def _scenario(name):
    return loads_scenario(DEMO_SCENARIO) if name == "demo" else load_scenario(str(PAPER / name))


@pytest.mark.parametrize(
    "name", ["demo", "fig9/llama2-7b-slow-M.toml", "table6/qwen2.5-14b-stop-2h.toml"]
)  # fmt: skip
def test_no_policy_exceeds_the_capacity_bound(name):
    """Every built policy's average throughput stays at or under its capacity bound."""
    out = simulate_scenario(_scenario(name), list(POLICIES), 0)
    for policy, run in out["policies"].items():
        assert run["samples_per_s"] <= run["capacity_bound_samples_per_s"] * (1 + 1e-9), policy


def test_fault_free_is_the_best_healthy_plan():
    """X0 in the JSON is at least the uniform plan's rate and equals the whole-run bound rate."""
    scenario = _scenario("table6/qwen2.5-14b-stop-2h.toml")
    job = scenario.job
    uniform = PlanTimer(job, 0).samples_per_s(job.initial_plan(), job.cluster)
    out = simulate_scenario(scenario, ["none"], 0)
    assert out["fault_free_samples_per_s"] >= uniform
    run = out["policies"]["none"]
    assert run["capacity_bound_samples_per_s"] <= out["fault_free_samples_per_s"] + 1e-6
