"""`resihp plan SCENARIO --at-s T --policy P` and `resihp.sim.job.plan_at`: the plan held at T."""

import json

import pytest

from resihp.cli.main import main
from resihp.core.scenario import loads_scenario
from resihp.sim.job import plan_at

SCENARIO = """
name = "plan-at-test"
[model]
preset = "llama2-7b"
[cluster]
nodes = 2
gpus_per_node = 8
gpu = "a100-80g"
[parallel]
tp = 4
dp = 2
pp = 2
microbatches = 8
seq_len = 8192
[run]
duration_s = 3600
[[faults]]
kind = "stop"
at_s = 600
device = 5
"""

KEYS = ("policy", "at_s", "replicas", "standby", "dead", "predicted_iteration_s", "samples_per_s",
        "capacity_bound_samples_per_s", "peak_memory_bytes")  # fmt: skip


@pytest.fixture()
def scenario(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO)
    return path


@pytest.mark.parametrize("policy", ["resihp", "resihp-paper"])
def test_plan_at_lists_the_dead_device_and_does_not_use_it(scenario, tmp_path, policy):
    """After a detected fail-stop the JSON has the §5.3 keys, lists the device as dead, never uses it."""
    out_path = tmp_path / "p.json"
    assert main(["plan", str(scenario), "--at-s", "1200", "--policy", policy, "--json", str(out_path)]) == 0
    out = json.loads(out_path.read_text())
    for key in KEYS:
        assert key in out
    assert out["policy"] == policy and out["at_s"] == 1200
    assert out["dead"] == [5]
    used = {x for replica in out["replicas"] for st in replica for x in st["devices"]}
    assert 5 not in used and 5 not in out["standby"]
    assert 0 < out["samples_per_s"] <= out["capacity_bound_samples_per_s"] * (1 + 1e-6)


def test_plan_at_before_the_fault_is_the_initial_plan(scenario):
    """Before any fault the policy still holds the job's initial plan on the healthy cluster."""
    s = loads_scenario(SCENARIO)
    plan, cluster = plan_at(s, "resihp", 100.0)
    assert plan == s.job.initial_plan() and all(cluster.alive)


def test_plan_at_reports_an_abort_as_none():
    """`none` aborts on a fail-stop: no plan after its detection."""
    plan, cluster = plan_at(loads_scenario(SCENARIO), "none", 3000.0)
    assert plan is None and not cluster.alive[5]


def test_plan_at_rejects_a_negative_time():
    """A negative time is the user's error."""
    with pytest.raises(ValueError, match="at_s"):
        plan_at(loads_scenario(SCENARIO), "resihp", -1.0)
