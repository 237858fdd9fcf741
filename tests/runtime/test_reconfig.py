"""The elastic runtime: planned replans and fail-stop recovery reproduce the reference training.

One spawn per test, several checks each; the oracle is `train_reference` (same seed, same global
batch). Losses agree to 1e-5 relative (planned replan) / 1e-4 (fail-stop re-run); parameters to an
lr-scaled tolerance, since AdamW's first steps move each entry by about lr·sign(g) and a sign flip
of a tiny gradient after a different reduction order moves it by up to 2·lr.
"""

import pytest

from resihp.core.model_spec import ModelSpec
from resihp.core.plan import Plan, Stage
from resihp.runtime.config import TrainConfig
from resihp.runtime.control.pids import alive
from resihp.runtime.reference import reference_for
from resihp.runtime.train import run_training

pytestmark = pytest.mark.slow

SPEC = ModelSpec("t", 4, 32, 8, 2, 48, 256)


def test_planned_replans_change_tp_layers_migration_and_standby(check_state):
    """gen 0 uniform tp2 x pp2 x dp2; at iteration 2 gen 1: TP 3 (3,3,2) and TP 2 (5,3) stages,
    different layer cuts per replica, a migrated micro-batch, device 7 on standby; at iteration 4
    gen 2: device 7 back (receives state it never held), device 0 to standby."""
    gen0 = Plan.uniform(SPEC, 2, 2, 2, 2)
    r0 = (Stage((0, 1, 2), (0, 1), (3, 3, 2), (20, 16, 12)), Stage((3,), (1, 4), (8,), (48,)))
    r1 = (Stage((4,), (0, 1), (8,), (48,)), Stage((5, 6), (1, 4), (5, 3), (10, 38)))
    gen1 = Plan(SPEC, (r0, r1), (2, 2), "1f1b", assignment=((0, 1, 1, 1),), standby=(7,))
    r0 = (Stage((1, 2), (0, 3), (4, 4), (24, 24)), Stage((3,), (3, 4), (8,), (48,)))
    r1 = (Stage((4, 7), (0, 2), (6, 2), (30, 18)), Stage((5, 6), (2, 4), (2, 6), (8, 40)))
    gen2 = Plan(SPEC, (r0, r1), (2, 2), "gpipe", standby=(0,))
    config = TrainConfig(seq_len=32, iterations=6, p2p="chunked", detect_slow=False)
    res = run_training(config, gen0, progress=False, return_state=True, replans=[(2, gen1), (4, gen2)])
    ref_losses, ref_state = reference_for(gen0, config)
    losses = [row["loss"] for row in res["iterations"]]
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    assert [row["iter"] for row in res["iterations"]] == list(range(6))
    assert [row["generation"] for row in res["iterations"]] == [0, 0, 1, 1, 2, 2]
    kinds = [(e["iter"], e["kind"]) for e in res["events"]]
    assert (2, "replan") in kinds and (4, "replan") in kinds
    assert [e["generation"] for e in res["events"] if e["kind"] == "state-transfer"] == [1, 2]
    assert set(res["state"]) == {0, 1}
    check_state(res, ref_state, config.lr)
    assert alive(res["worker_pids"]) == [], "orphan worker processes"


def test_fail_stop_of_a_tp_member_recovers_without_restart(tmp_path, check_state):
    """tp2 x pp2 x dp2; device 5 (TP rank 1 of replica 1, stage 0) stops at iteration 2 while device
    1 computes 5x slower from iteration 1: the run completes on the same processes, replica 1's
    stage 0 shrinks to TP 1 with its shard from replica 0, iteration 2 is re-run under generation
    1, and the committed history equals the fault-free reference."""
    faults = tmp_path / "faults.toml"
    faults.write_text(
        "[[faults]]\nkind = 'stop'\ndevice = 5\nat_iter = 2\n"
        "[[faults]]\nkind = 'slow'\ndevice = 1\nat_iter = 1\nseverity = 0.2\n"
    )
    config = TrainConfig(seq_len=32, microbatches=2, iterations=4, faults=str(faults), detect_slow=False)
    plan = Plan.uniform(SPEC, 2, 2, 2, 2)
    res = run_training(config, plan, progress=False, return_state=True)
    ref_losses, ref_state = reference_for(plan, config)
    assert [row["iter"] for row in res["iterations"]] == [0, 1, 2, 3]
    assert [row["generation"] for row in res["iterations"]] == [0, 0, 1, 1]
    assert [row["loss"] for row in res["iterations"]] == pytest.approx(ref_losses, rel=1e-4)
    stops = [e for e in res["events"] if e["kind"] == "fail-stop"]
    assert [(e["iter"], e["devices"]) for e in stops] == [(2, [5])]
    assert next(e for e in res["events"] if e["kind"] == "replan")["reason"].startswith("resihp")
    assert stops[0]["recovery"]["kill_to_commit_s"] > 0
    assert {(e["kind"], e["iter"]) for e in res["events"]} >= {("inject-slow", 1), ("replan", 2)}
    final = res["plans"][-1]["replicas"][1][0]
    assert final["devices"] == [4] and final["tp_split"] == [8]
    slow = [r for r in res["trace"] if r["device"] == 1 and r["iter"] == 3][0]
    fast = [r for r in res["trace"] if r["device"] == 0 and r["iter"] == 3][0]
    assert slow["compute_s"] > 2 * fast["compute_s"]  # p = 0.2: about 5x its TP peer
    check_state(res, ref_state, config.lr)
    assert alive(res["worker_pids"]) == [], "orphan worker processes"


def test_loss_of_a_whole_stage_is_served_by_the_other_replica(tmp_path, check_state):
    """Both TP members of replica 1's last stage (devices 6, 7) stop at iteration 1 while the link
    1-3 is slow: one failure, one replan without them, in which the resihp policy makes that stage
    hollow and migrates its micro-batches to replica 0's (same global batch); the losses still
    equal the reference."""
    faults = tmp_path / "faults.toml"
    faults.write_text(
        "[[faults]]\nkind = 'stop'\ndevice = 6\nat_iter = 1\n"
        "[[faults]]\nkind = 'stop'\ndevice = 7\nat_iter = 1\n"
        "[[faults]]\nkind = 'link'\nsrc = 1\ndst = 3\nat_iter = 0\nseverity = 0.5\n"
    )
    # a link fault needs the link model (without it, it would have no effect and is rejected)
    config = TrainConfig(
        seq_len=32, microbatches=2, iterations=3, faults=str(faults), link_mb_per_s=1.0, detect_slow=False
    )
    plan = Plan.uniform(SPEC, 2, 2, 2, 2)
    res = run_training(config, plan, progress=False, return_state=True)
    ref_losses, ref_state = reference_for(plan, config)
    assert [row["iter"] for row in res["iterations"]] == [0, 1, 2]
    assert [row["loss"] for row in res["iterations"]] == pytest.approx(ref_losses, rel=1e-4)
    assert all(row["samples"] == 4 for row in res["iterations"])
    # One failure, one replan: the controller replans only once every survivor reported its abort,
    # and devices 6 and 7 never report (they die), so both deaths precede the one replan however
    # late the machine's load makes the second one (`failover.at_rest`).
    kinds = [(e["kind"], e.get("devices")) for e in res["events"] if e["kind"] in ("fail-stop", "replan")]
    assert sorted(kinds[:2]) == [("fail-stop", [6]), ("fail-stop", [7])] and len(kinds) == 3
    replan = next(e for e in res["events"] if e["kind"] == "replan")
    assert replan["reason"].startswith("resihp") and set(replan["devices"]) == {0, 1, 2, 3, 4, 5}
    assert [row["generation"] for row in res["iterations"]] == [0, 1, 1]
    final = res["plans"][-1]
    assert final["microbatches"] == [2, 2] and final["assignment"]
    check_state(res, ref_state, config.lr)
    assert alive(res["worker_pids"]) == [], "orphan worker processes"


def test_stopped_device_rejoins_and_the_plan_grows_back(tmp_path, check_state):
    """Device 5 stops at iteration 1 and a fresh process for it re-joins at iteration 3: it receives
    its shard from its TP peer and replica 0 and the initial layout returns (generation 2); the
    committed history equals the reference."""
    faults = tmp_path / "faults.toml"
    faults.write_text(
        "[[faults]]\nkind = 'stop'\ndevice = 5\nat_iter = 1\n"
        "[[faults]]\nkind = 'rejoin'\ndevice = 5\nat_iter = 3\n"
    )
    config = TrainConfig(seq_len=32, microbatches=2, iterations=5, faults=str(faults), detect_slow=False)
    plan = Plan.uniform(SPEC, 2, 2, 2, 2)
    res = run_training(config, plan, progress=False, return_state=True)
    ref_losses, ref_state = reference_for(plan, config)
    assert [row["iter"] for row in res["iterations"]] == list(range(5))
    assert [row["generation"] for row in res["iterations"]] == [0, 1, 1, 2, 2]
    assert [row["loss"] for row in res["iterations"]] == pytest.approx(ref_losses, rel=1e-4)
    kinds = [(e["iter"], e["kind"], e.get("devices")) for e in res["events"]]
    assert (1, "fail-stop", [5]) in kinds and (3, "rejoin", [5]) in kinds
    final = res["plans"][-1]
    assert final["replicas"] == plan.to_dict()["replicas"] and final["generation"] == 2
    check_state(res, ref_state, config.lr)
    # 8 members, the re-joined one, and the node agent that spawned them
    assert len(res["worker_pids"]) == 10 and alive(res["worker_pids"]) == [], "orphan worker processes"


def test_two_stops_in_sequence_one_before_any_step_under_zbh1(tmp_path, check_state):
    """ZB-H1 with the explicit shrink rule (no scheduler policy): device 2 (a last-stage TP member)
    stops before iteration 0 commits anything (state moves without Adam moments), device 4 (a
    first-stage member of the other replica) at iteration 2: two recoveries, generations 0 -> 1 ->
    2, and the reference's losses."""
    faults = tmp_path / "faults.toml"
    faults.write_text(
        "[[faults]]\nkind = 'stop'\ndevice = 2\nat_iter = 0\n"
        "[[faults]]\nkind = 'stop'\ndevice = 4\nat_iter = 2\n"
    )
    config = TrainConfig(seq_len=32, microbatches=2, iterations=4, faults=str(faults), detect_slow=False)
    plan = Plan.uniform(SPEC, 2, 2, 2, 2, "zbh1")
    res = run_training(config, plan, progress=False, return_state=True, policy=None)
    ref_losses, ref_state = reference_for(plan, config)
    assert [row["iter"] for row in res["iterations"]] == list(range(4))
    assert [row["generation"] for row in res["iterations"]] == [1, 1, 2, 2]
    assert [row["loss"] for row in res["iterations"]] == pytest.approx(ref_losses, rel=1e-4)
    stops = [(e["iter"], e["devices"]) for e in res["events"] if e["kind"] == "fail-stop"]
    assert stops == [(0, [2]), (2, [4])]
    final = res["plans"][-1]["replicas"]
    assert final[0][1]["devices"] == [3] and final[1][0]["devices"] == [5]
    check_state(res, ref_state, config.lr)
    assert alive(res["worker_pids"]) == [], "orphan worker processes"


def test_stop_during_the_dp_gradient_reduction(tmp_path, check_state):
    """tp1 x pp2 x dp2; device 3 (replica 1's last stage) exits on entering its gradient all-reduce of
    iteration 2, when its DP peer (device 1) is inside the same all-reduce: the peer's collective
    fails, nobody steps, iteration 2 is re-run once under generation 1 (replica 1's micro-batches
    on replica 0's last stage), and the committed history equals the reference's."""
    faults = tmp_path / "faults.toml"
    faults.write_text("[[faults]]\nkind = 'stop'\ndevice = 3\nat_iter = 2\nphase = 'allreduce'\n")
    config = TrainConfig(seq_len=32, microbatches=2, iterations=4, faults=str(faults), detect_slow=False)
    plan = Plan.uniform(SPEC, 1, 2, 2, 2)
    res = run_training(config, plan, progress=False, return_state=True)
    ref_losses, ref_state = reference_for(plan, config)
    assert [row["iter"] for row in res["iterations"]] == [0, 1, 2, 3]
    assert [row["generation"] for row in res["iterations"]] == [0, 0, 1, 1]
    assert [row["loss"] for row in res["iterations"]] == pytest.approx(ref_losses, rel=1e-4)
    kinds = [(e["iter"], e["kind"], e.get("devices")) for e in res["events"]]
    assert (2, "inject-stop", [3]) in kinds and (2, "fail-stop", [3]) in kinds
    assert next(e for e in res["events"] if e["kind"] == "inject-stop")["phase"] == "allreduce"
    noticed = next(e for e in res["events"] if e["kind"] == "fail-stop")["noticed"]
    assert noticed[1].startswith("RuntimeError"), noticed  # the DP peer: its all-reduce failed
    assert 3 not in res["plans"][-1]["replicas"][1][1]["devices"]
    check_state(res, ref_state, config.lr)
    assert alive(res["worker_pids"]) == [], "orphan worker processes"
