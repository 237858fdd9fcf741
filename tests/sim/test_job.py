"""The job simulator over wall-clock time: determinism, aborts, pauses and the capacity bound."""

import json

import numpy as np
import pytest

from resihp.core.faults import FaultSpec
from resihp.core.scenario import loads_scenario
from resihp.sched import POLICIES
from resihp.sim.compare import dumps, simulate_scenario
from resihp.sim.job import simulate

BASE = """
name = "t"
[model]
preset = "llama2-7b"
[cluster]
nodes = 2
gpus_per_node = 8
[parallel]
tp = 4
dp = 2
pp = 2
seq_len = 8192
microbatches = 8
[run]
duration_s = {duration}
"""


def scenario(faults: str = "", duration: int = 7200):
    return loads_scenario(BASE.format(duration=duration) + faults)


STOP = '[[faults]]\nkind = "stop"\nat_s = {t}\ndevice = {d}\n'


def test_same_seed_gives_identical_json():
    """Two runs of the same scenario and seed serialise to the same bytes."""
    s = scenario('[faults]\ngenerator = "mixed"\ninterval_s = 1800\n')
    names = ["recycle", "greyhound", "oobleck+greyhound"]
    assert dumps(simulate_scenario(s, names, 3)) == dumps(simulate_scenario(s, names, 3))


def test_none_aborts_on_a_stop():
    """Without mitigation a fail-stop hangs the job for the hang timeout, then aborts it."""
    run = simulate(scenario(STOP.format(t=600, d=5)), POLICIES["none"]())
    assert run.aborted and run.abort_t_s == pytest.approx(600 + 600)
    assert run.timeline[-1][1] == 0.0
    assert run.samples_per_s < run.capacity_bound_samples_per_s


def test_recycle_aborts_when_every_replica_of_a_stage_dies():
    """Killing stage 0 in both replicas leaves ReCycle no peer: reported as an abort."""
    run = simulate(scenario(STOP.format(t=600, d=1) + STOP.format(t=1200, d=9)), POLICIES["recycle"]())
    assert run.aborted and run.abort_t_s == pytest.approx(1203.0)
    assert any(e["kind"] == "abort" for e in run.events)


def test_recycle_survives_one_dead_stage_at_reduced_throughput():
    """One dead TP group: ReCycle keeps training, slower than fault-free, never above the bound."""
    clean = simulate(scenario(), POLICIES["recycle"]())
    run = simulate(scenario(STOP.format(t=60, d=2)), POLICIES["recycle"]())
    assert not run.aborted
    assert 0.3 * clean.samples_per_s < run.samples_per_s < 0.8 * clean.samples_per_s
    assert run.samples_per_s <= run.capacity_bound_samples_per_s


@pytest.mark.parametrize("name", [n for n in POLICIES if not n.startswith("resihp")])
def test_every_baseline_stays_under_the_capacity_bound(name):
    """On the mixed pattern every baseline's average throughput is at most the capacity bound."""
    s = scenario('[faults]\ngenerator = "mixed"\ninterval_s = 1800\n')
    run = simulate(s, POLICIES[name](), seed=1)
    assert 0.0 <= run.samples_per_s <= run.capacity_bound_samples_per_s + 1e-9
    json.dumps(run.to_dict())


def test_greyhound_climbs_its_ladder_on_a_fail_slow():
    """A persistent fail-slow: S2 at detection (with a validation pause), then a ski-rental escalation."""
    s = scenario('[[faults]]\nkind = "slow"\nat_s = 60\ndevice = 6\nseverity = 0.4\n')
    run = simulate(s, POLICIES["greyhound"]())
    kinds = [e["kind"] for e in run.events]
    assert "replan" in kinds and "escalate" in kinds
    none = simulate(s, POLICIES["none"]())
    assert run.samples_per_s > 1.2 * none.samples_per_s


def test_checkpoint_restart_pays_hang_restart_and_lost_work():
    """A stop costs checkpoint-restart the hang detection, u0 and seeded lost work."""
    run = simulate(scenario(STOP.format(t=600, d=5)), POLICIES["checkpoint-restart"]())
    replan = next(e for e in run.events if e["kind"] == "replan")
    assert replan["t_s"] == pytest.approx(1200.0)
    assert 600.0 <= replan["pause_s"] <= 4200.0


def test_unknown_policy_is_refused():
    """A policy name nobody registered is refused before anything runs, never stubbed."""
    with pytest.raises(ValueError, match="policy = 'malleus': unknown policy; allowed: none, "):
        simulate_scenario(scenario(), ["recycle", "malleus"], 0)


def test_iteration_runs_and_at_iter_faults():
    """`run.iterations` and `at_iter` are measured in fault-free iteration times."""
    text = BASE.replace("duration_s = {duration}", "iterations = 1000") + STOP.format(t=0, d=3).replace(
        "at_s = 0", "at_iter = 500"
    )
    run = simulate(loads_scenario(text), POLICIES["recycle"]())
    stop = next(e for e in run.events if e["kind"] == "stop")
    horizon = run.timeline[-1][0]
    assert 0 < stop["t_s"] < horizon
    assert FaultSpec("stop", at_iter=1, device=0).at_iter == 1


def test_plot_timeline_writes_a_png(tmp_path):
    """`plot_timeline` draws every policy's timeline with fault markers into a PNG."""
    from resihp.sim.plot import plot_timeline

    out = simulate_scenario(scenario(STOP.format(t=600, d=5)), ["none", "recycle"], 0)
    path = tmp_path / "t.png"
    plot_timeline(out, str(path))
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_replica_classes_evaluate_like_the_chunk_by_chunk_oracle():
    """A plan whose replicas fall into classes (uneven batch shares, a slow device, a slow link) is
    evaluated by the tiled evaluator exactly as the scalar oracle walks it."""
    from oracle import oracle_evaluate

    from resihp.core.plan import split_by_weight
    from resihp.core.program import compile_plan
    from resihp.cost import build_costs
    from resihp.evaluator.predict import predict

    text = BASE.format(duration=60).replace("nodes = 2", "nodes = 8").replace("dp = 2", "dp = 8")
    job = loads_scenario(text).job
    plan = job.initial_plan()
    plan = plan.with_changes(microbatches=split_by_weight(plan.global_microbatches, [1, 0.5] + [1] * 6, 1))
    cluster = job.cluster.with_speed(13, 0.5).with_link(0, 4, 0.2)
    got = predict(job, plan, cluster, 5, send_blocks=False)
    batch = job.workload.pack(5, plan.global_microbatches)
    costs = build_costs(job.model, plan, cluster, np.full(batch.count, float(batch.seq_len)), batch.sum_sq,
                        send_blocks=False)  # fmt: skip
    want = oracle_evaluate(compile_plan(plan), costs)
    assert got.iteration_s == want["iteration_s"]
    assert got.result.group_end_s == want["group_end_s"]
