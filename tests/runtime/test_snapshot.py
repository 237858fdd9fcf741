"""Snapshot fallback: when every replica of a stage is lost, a peer's in-memory snapshot of the last
committed state restores it, and the run continues without restart or lost iterations."""

import queue
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from resihp.core.model_spec import ModelSpec
from resihp.core.plan import Plan
from resihp.runtime.adapt.reconfig import shrink_plan
from resihp.runtime.config import TrainConfig
from resihp.runtime.control.member import Commits, _iterate
from resihp.runtime.control.pids import alive
from resihp.runtime.control.protocol import Abort
from resihp.runtime.control.transport import Channel
from resihp.runtime.reference import reference_for
from resihp.runtime.state.snapshot import Keeper, holders
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


@pytest.mark.parametrize("arrives", [True, False])
def test_an_abort_waits_for_the_exchange_in_flight_and_names_the_newest_complete_tag(arrives):
    """A member whose iteration 3 fails reports `Abort` only once its snapshot exchange of tag 3
    (in flight on the side thread, 0.2 s more) ended: it names 3 when the exchange completed, 2
    when a death interrupted it."""
    keeper = Keeper(Plan.uniform(SPEC, 2, 2, 2, 2), 0, {}, None)
    keeper.kept = {1: "tag 1", 2: "tag 2"}
    outcome: dict = {}

    def exchange() -> None:
        time.sleep(0.2)
        if arrives:
            outcome["got"] = "tag 3"

    keeper.flight, keeper.thread = (3, outcome), threading.Thread(target=exchange)
    keeper.thread.start()

    def peer_died(it):
        raise RuntimeError("Connection closed by peer")

    opt = SimpleNamespace(zero_grad=lambda set_to_none: None)
    worker = SimpleNamespace(device=0, run_iteration=peer_died, opt=opt)
    results = Channel(queue.Queue())
    assert _iterate(worker, Commits(0, 0, [], None, results), 3, 5, keeper) == ("abort", 3)
    sent = results.recv()
    assert isinstance(sent, Abort) and (sent.iter, sent.snapshot) == (3, 3 if arrives else 2)
    assert sorted(keeper.kept) == ([2, 3] if arrives else [1, 2])


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
    stage); their exchange of 2 fails (almost always: the lost devices exit right after starting
    theirs), so their `Abort`s name tag 1. The recovery rolls back one iteration: the state of
    layers 2..3 before iteration 1 comes from the complete snapshots on devices 0, 1 (the
    survivors restore their own copies of 1), iteration 1 runs again on the 4 survivors, and the
    history has no gap and no repeat, with the reference's losses. (Should an exchange beat the
    exit, the recovery starts from 2 instead, equally consistent.)"""
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
    to = restore[0]["to_iter"] if restore else None
    assert [(e["iter"], e["lost"]) for e in restore] == [(2, [2, 3, 6, 7])] and to in (1, 2)
    replan = [e for e in res["events"] if e["kind"] == "replan"]
    assert [e["iter"] for e in replan] == [to]  # generation 1 starts at the restored iteration
    seen = [(r["iter"], r["device"]) for r in res["trace"]]
    assert len(seen) == len(set(seen)) and sorted({i for i, _ in seen}) == [0, 1, 2, 3]
    assert {r["generation"] for r in res["trace"] if r["iter"] >= to} == {1}  # a first run of 1: dropped
    assert set(res["plans"][-1]["replicas"][0][1]["devices"]) <= {0, 1, 4, 5}
    for d, state in res["state"].items():
        for name, value in state.items():
            torch.testing.assert_close(
                value, ref_state[name], atol=2.5 * config.lr, rtol=0, msg=f"{d} {name}"
            )
    assert alive(res["worker_pids"]) == [], "orphan worker processes"


@pytest.mark.slow
def test_a_stage_lost_after_its_snapshot_arrived_restores_without_a_rollback(tmp_path):
    """tp2 x pp2 x dp2 with snapshots and gradient clipping (the global norm spans both stages):
    both copies of the last stage stop on entering iteration 2's gradient all-reduce, so their
    holders 0, 1, 4, 5 never reach 2's STEP either; but the exchange of tag 2 (~100 KB) completed
    while 2's forward and backward ran, and the holders' `Abort`s say so (`Abort.snapshot`). The
    recovery restores layers 2..3 as of 2 from those snapshots and re-runs nothing (before issue
    17's abort report: a rollback to 1), with the reference's losses."""
    faults = tmp_path / "faults.toml"
    faults.write_text(
        "".join(
            f"[[faults]]\nkind = 'stop'\ndevice = {d}\nat_iter = 2\nphase = 'allreduce'\n"
            for d in (2, 3, 6, 7)
        )
    )
    config = TrainConfig(
        seq_len=32, microbatches=2, iterations=4, faults=str(faults), snapshots=True, grad_clip=1.0,
        detect_slow=False,
    )  # fmt: skip
    plan = Plan.uniform(SPEC, 2, 2, 2, 2)
    res = run_training(config, plan, progress=False)
    assert [row["loss"] for row in res["iterations"]] == pytest.approx(
        reference_for(plan, config)[0], rel=1e-4
    )
    restore = [e for e in res["events"] if e["kind"] == "snapshot-restore"]
    assert [(e["iter"], e["lost"], e["to_iter"]) for e in restore] == [(2, [2, 3, 6, 7], 2)]
    assert [e["iter"] for e in res["events"] if e["kind"] == "replan"] == [2]
    seen = [(r["iter"], r["device"]) for r in res["trace"]]
    assert len(seen) == len(set(seen)) and sorted({i for i, _ in seen}) == [0, 1, 2, 3]
    assert alive(res["worker_pids"]) == [], "orphan worker processes"
