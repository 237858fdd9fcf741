"""`resihp plan --json` reports the state transfer from the scenario's fault-free plan into the
plan it prints (`core.transfer_plan`), so the figures exist at any size without running a model."""

import json

from resihp.cli.main import main
from resihp.core.scenario import load_scenario
from resihp.core.transfer_plan import plan_transfer
from resihp.sim.job import plan_at

SCENARIO = """
name = "plan-transfer-test"
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


def test_plan_json_reports_the_transfer_into_the_printed_plan(tmp_path):
    """Before the fault: the fault-free plan itself, nothing moves. After device 5's stop: the
    planner's figures for the fault-free plan -> the policy's plan with device 5's shards lost."""
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO)
    out = tmp_path / "p.json"
    assert main(["plan", str(path), "--json", str(out)]) == 0
    first = json.loads(out.read_text())["transfer"]
    assert first == {
        "from": "fault-free plan",
        "bytes_moved": 0,
        "lower_bound_bytes": 0,
        "max_received_bytes": 0,
    }
    assert main(["plan", str(path), "--at-s", "1200", "--json", str(out)]) == 0
    got = json.loads(out.read_text())["transfer"]
    scenario = load_scenario(str(path))
    plan, cluster = plan_at(scenario, "resihp", 1200.0)
    initial = scenario.job.initial_plan()
    want = plan_transfer(initial, plan, [d for d in initial.devices() if d != 5], node_of=cluster.node_of)
    assert got == {"from": "fault-free plan", **want.figures()}
    assert 0 < got["max_received_bytes"] <= got["bytes_moved"] <= 1.1 * got["lower_bound_bytes"]
    assert not any(p.sender == 5 for p in want.pieces)
