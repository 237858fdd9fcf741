"""Snapshot fallback: when every replica of a stage is lost, a peer's in-memory snapshot of the last
committed state restores it, and the run continues without restart or lost iterations."""

import pytest
import torch

from resihp.core.model_spec import ModelSpec
from resihp.core.plan import Plan
from resihp.runtime.adapt.reconfig import shrink_plan
from resihp.runtime.config import TrainConfig
from resihp.runtime.control.pids import alive
from resihp.runtime.reference import reference_for
from resihp.runtime.state.snapshot import holders
from resihp.runtime.state.transfer import source_stages
from resihp.runtime.train import run_training

SPEC = ModelSpec("t", 4, 32, 8, 2, 48, 256)


def test_holders_sit_on_another_stage_index():
    """Every device's snapshot is kept on a stage holding other layers, in dp = 1 and dp = 2; so the
    loss of every replica of one stage still leaves a source for each tensor."""
    plan = Plan.uniform(SPEC, 2, 2, 2, 2)
    assert holders(plan) == {0: 2, 1: 3, 2: 0, 3: 1, 4: 6, 5: 7, 6: 4, 7: 5}
    one = Plan.uniform(SPEC, 2, 2, 1, 2)
    assert holders(one) == {0: 2, 1: 3, 2: 0, 3: 1}
    assert holders(Plan.uniform(SPEC, 2, 1, 1, 2)) == {}  # a single stage: nowhere else to keep it
    members = {0, 1, 4, 5}
    with pytest.raises(ValueError, match="no live copy"):
        source_stages(plan, members)
    sources = source_stages(plan, members, holders(plan))
    assert {st.devices for st in sources.values()} == {(0, 1), (2, 3)}


def test_absorb_merges_a_lost_stage_into_its_neighbour():
    """dp = 1: the lost last stage's layers go to the first stage; a lost first stage's to the next;
    without `absorb` the old ValueError stays."""
    one = Plan.uniform(SPEC, 2, 2, 1, 2)
    p = shrink_plan(one, {2, 3}, absorb=True)
    assert [(st.devices, st.layers) for st in p.replicas[0]] == [((0, 1), (0, 4))]
    assert p.microbatches == (2,) and p.standby == ()
    p = shrink_plan(one, {0, 1, 3}, absorb=True)
    assert [(st.devices, st.layers) for st in p.replicas[0]] == [((2,), (0, 4))]
    p = shrink_plan(Plan.uniform(SPEC, 2, 2, 2, 2), {2, 3, 6, 7}, absorb=True)
    assert [(st.devices, st.layers) for st in p.replicas[0]] == [((0, 1), (0, 4))]
    assert p.microbatches == (4,) and p.standby == (4, 5)
    with pytest.raises(ValueError, match="every replica"):
        shrink_plan(one, {2, 3})


@pytest.mark.slow
def test_dp1_loses_its_last_stage_and_continues_from_snapshots(tmp_path):
    """tp2 x pp2 x dp1 with snapshots: devices 2, 3 (the only copy of layers 2..3) stop at iteration
    2; the stage's state comes from the snapshots on devices 0, 1, which go on with all 4 layers
    (`shrink_plan(absorb=True)`), and the losses equal the reference's."""
    faults = tmp_path / "faults.toml"
    faults.write_text("".join(f"[[faults]]\nkind = 'stop'\ndevice = {d}\nat_iter = 2\n" for d in (2, 3)))
    config = TrainConfig(seq_len=32, microbatches=4, iterations=4, faults=str(faults), snapshots=True)
    plan = Plan.uniform(SPEC, 2, 2, 1, 4)
    res = run_training(config, plan, progress=False)
    ref_losses, _ = reference_for(plan, config)
    assert [row["iter"] for row in res["iterations"]] == [0, 1, 2, 3]
    assert [row["loss"] for row in res["iterations"]] == pytest.approx(ref_losses, rel=1e-4)
    restore = [(e["iter"], e["devices"], e["lost"]) for e in res["events"] if e["kind"] == "snapshot-restore"]
    assert restore == [(2, [0, 1], [2, 3])]
    final = res["plans"][-1]["replicas"]
    assert [(st["devices"], st["layers"]) for st in final[0]] == [([0, 1], [0, 4])]
    assert alive(res["worker_pids"]) == [], "orphan worker processes"


@pytest.mark.slow
def test_losing_every_replica_of_a_stage_restores_it_from_snapshots(tmp_path):
    """tp2 x pp2 x dp2 with snapshots; both copies of the last stage (devices 2, 3, 6, 7) stop at
    the start of iteration 2, inside the overlap window: the snapshots of the state before 2 are
    in flight, and their holders 0, 1, 4, 5 can never reach 2's STEP (the pipeline needs the lost
    stage), so no holder certified them. The recovery rolls back one iteration: the state of
    layers 2..3 before iteration 1 comes from the complete snapshots on devices 0, 1 (the
    survivors restore their own copies of 1), iteration 1 runs again on the 4 survivors, and the
    history has no gap and no repeat, with the reference's losses."""
    faults = tmp_path / "faults.toml"
    faults.write_text(
        "".join(f"[[faults]]\nkind = 'stop'\ndevice = {d}\nat_iter = 2\n" for d in (2, 3, 6, 7))
    )
    config = TrainConfig(seq_len=32, microbatches=2, iterations=4, faults=str(faults), snapshots=True)
    plan = Plan.uniform(SPEC, 2, 2, 2, 2)
    res = run_training(config, plan, progress=False, return_state=True)
    ref_losses, ref_state = reference_for(plan, config)
    assert [row["iter"] for row in res["iterations"]] == [0, 1, 2, 3]
    assert [row["loss"] for row in res["iterations"]] == pytest.approx(ref_losses, rel=1e-4)
    stops = sorted(d for e in res["events"] if e["kind"] == "fail-stop" for d in e["devices"])
    assert stops == [2, 3, 6, 7]
    restore = [e for e in res["events"] if e["kind"] == "snapshot-restore"]
    assert [(e["iter"], e["lost"], e["to_iter"]) for e in restore] == [(2, [2, 3, 6, 7], 1)]
    replan = [e for e in res["events"] if e["kind"] == "replan"]
    assert [e["iter"] for e in replan] == [1]  # generation 1 starts at the rolled-back iteration
    seen = [(r["iter"], r["device"]) for r in res["trace"]]
    assert len(seen) == len(set(seen)) and sorted({i for i, _ in seen}) == [0, 1, 2, 3]
    assert {r["generation"] for r in res["trace"] if r["iter"] >= 1} == {1}  # the first run of 1: dropped
    assert set(res["plans"][-1]["replicas"][0][1]["devices"]) <= {0, 1, 4, 5}
    for d, state in res["state"].items():
        for name, value in state.items():
            torch.testing.assert_close(
                value, ref_state[name], atol=2.5 * config.lr, rtol=0, msg=f"{d} {name}"
            )
    assert alive(res["worker_pids"]) == [], "orphan worker processes"
