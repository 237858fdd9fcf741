"""State moves point to point, only what changes hands: the bytes each member receives in a run are
the transfer planner's (`core.transfer_plan`), and the losses stay the reference's."""

import pytest

from resihp.core.model_spec import ModelSpec
from resihp.core.plan import Plan, Stage
from resihp.core.transfer_plan import plan_transfer
from resihp.runtime.config import TrainConfig
from resihp.runtime.control.pids import alive
from resihp.runtime.reference import reference_for
from resihp.runtime.train import run_training

pytestmark = pytest.mark.slow

SPEC = ModelSpec("t", 4, 32, 8, 2, 48, 256)


def planned(plans: list[Plan], g: int, members=None, snapshots=None):
    """The planner's transfer into generation g from g - 1 (every device of g - 1 holds its
    shard unless `members` says otherwise); the runtime puts every device on one node."""
    old = plans[g - 1]
    return plan_transfer(old, plans[g], old.devices() if members is None else members, snapshots, lambda d: 0)


def test_every_replan_kind_moves_what_the_planner_says(check_state):
    """gen 0 uniform tp2 x pp2 x dp2, then one replan kind per iteration: 1 a migrated micro-batch
    (0 bytes), 2 a TP member excluded (device 1 to standby; device 0 runs stage 0 alone), 3 back
    (device 1 receives its shard again), 4 layers moved and TP re-split. Each generation's
    `state-transfer` event carries the bytes every member received, equal to the planner's,
    within 1.1 x the lower bound; losses equal the reference's."""
    gen0 = Plan.uniform(SPEC, 2, 2, 2, 2)
    r0, r1 = gen0.replicas
    gen1 = gen0.with_changes(assignment=((0, 1, 1, 1),))
    alone = Stage((0,), (0, 2), (8,), (48,))
    gen2 = gen0.with_changes(replicas=((alone, r0[1]), r1), standby=(1,))
    gen3 = gen0
    moved = (Stage((4, 5), (0, 3), (6, 2), (36, 12)), Stage((6, 7), (3, 4), (4, 4), (24, 24)))
    gen4 = gen0.with_changes(replicas=(r0, moved))
    gens = [gen0, gen1, gen2, gen3, gen4]
    config = TrainConfig(seq_len=32, iterations=6, detect_slow=False)
    res = run_training(
        config, gen0, progress=False, return_state=True, replans=[(g, p) for g, p in enumerate(gens) if g]
    )
    ref_losses, ref_state = reference_for(gen0, config)
    assert [row["loss"] for row in res["iterations"]] == pytest.approx(ref_losses, rel=1e-5)
    events = {e["generation"]: e for e in res["events"] if e["kind"] == "state-transfer"}
    assert sorted(events) == [1, 2, 3, 4]
    for g, ev in events.items():
        tp = planned(gens, g)
        assert ev["received_bytes"] == {str(d): b for d, b in sorted(tp.received.items())}, g
        assert ev["bytes_moved"] == ev["planned_bytes_moved"] == tp.bytes_moved, g
        assert ev["lower_bound_bytes"] == tp.lower_bound_bytes, g
        assert ev["max_received_bytes"] == tp.max_received_bytes, g
        assert ev["bytes_moved"] <= 1.1 * ev["lower_bound_bytes"], g
    assert events[1]["bytes_moved"] == 0  # migration only
    assert set(events[2]["received_bytes"]) == {"0"} and set(events[3]["received_bytes"]) == {"1"}
    assert events[4]["bytes_moved"] > 0
    check_state(res, ref_state, config.lr)
    assert alive(res["worker_pids"]) == [], "orphan worker processes"


@pytest.mark.parametrize("snapshots", [False, True])
def test_double_kill_recovers_from_a_cover_across_replicas(tmp_path, snapshots):
    """Devices 1 and 4 (stage 0 of both replicas, one TP member each) stop in the same iteration
    (1 at its start, 4 on entering the gradient all-reduce): devices 0 and 5 together hold every
    row of stage 0, so the run recovers in place, with the reference's losses; every transfer
    receives exactly what its plan says (benchmarks/double_kill.py repeats it 10 times each)."""
    faults = tmp_path / "faults.toml"
    faults.write_text(
        "[[faults]]\nkind = 'stop'\ndevice = 1\nat_iter = 2\n"
        "[[faults]]\nkind = 'stop'\ndevice = 4\nat_iter = 2\nphase = 'allreduce'\n"
    )
    config = TrainConfig(
        seq_len=32, microbatches=2, iterations=4, faults=str(faults), snapshots=snapshots, detect_slow=False
    )
    plan = Plan.uniform(SPEC, 2, 2, 2, 2)
    res = run_training(config, plan, progress=False)
    ref_losses, _ = reference_for(plan, config)
    assert [row["iter"] for row in res["iterations"]] == [0, 1, 2, 3]
    assert [row["loss"] for row in res["iterations"]] == pytest.approx(ref_losses, rel=1e-4)
    assert sorted(d for e in res["events"] if e["kind"] == "fail-stop" for d in e["devices"]) == [1, 4]
    transfers = [e for e in res["events"] if e["kind"] == "state-transfer"]
    assert transfers
    for ev in transfers:
        assert ev["bytes_moved"] == ev["planned_bytes_moved"] <= 1.1 * ev["lower_bound_bytes"]
    used = {d for r in res["plans"][-1]["replicas"] for st in r for d in st["devices"]}
    assert used <= {0, 2, 3, 5, 6, 7}
    assert alive(res["worker_pids"]) == [], "orphan worker processes"
