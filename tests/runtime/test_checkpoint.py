"""Periodic checkpoints and whole-job restarts (`resihp train --resume DIR`): the resumed loss
trajectory continues the uninterrupted one exactly, on the same or on a different plan."""

import os
import re

import pytest

from resihp.core.model_spec import ModelSpec
from resihp.core.plan import Plan, Stage
from resihp.runtime.config import TrainConfig
from resihp.runtime.control.pids import alive
from resihp.runtime.reference import reference_for
from resihp.runtime.state.checkpoint import iter_dir, load_meta
from resihp.runtime.state.verify import newest_usable
from resihp.runtime.train import run_training

SPEC = ModelSpec("t", 4, 32, 8, 2, 48, 256)


def test_checkpoint_options_are_validated(tmp_path):
    with pytest.raises(ValueError, match="run.checkpoint_every needs run.checkpoint_dir"):
        TrainConfig(checkpoint_every=2)
    with pytest.raises(ValueError, match="run.checkpoint_every = -1"):
        TrainConfig(checkpoint_every=-1, checkpoint_dir="x")
    for bad in (0, -1, True, "3", 2.0):
        with pytest.raises(
            ValueError, match=rf"^run.keep_checkpoints = {re.escape(repr(bad))}: must be an integer >= 1"
        ):
            TrainConfig.from_dict({"run": {"keep_checkpoints": bad}})
    assert TrainConfig.from_dict({"run": {"keep_checkpoints": 2}}).keep_checkpoints == 2
    cfg = TrainConfig.from_dict({"run": {"checkpoint_every": 5, "checkpoint_dir": "ck"}})
    assert (cfg.checkpoint_every, cfg.checkpoint_dir) == (5, "ck")
    with pytest.raises(ValueError, match="no complete checkpoint"):
        newest_usable(str(tmp_path))
    with pytest.raises(ValueError, match="no complete checkpoint"):
        run_training(TrainConfig(iterations=2), progress=False, resume=str(tmp_path))


@pytest.mark.slow
def test_resume_continues_the_loss_trajectory_on_the_same_and_another_plan(tmp_path):
    """6 iterations with a checkpoint every 2, keeping 2 (those at 4 and 6 stay); the newest one
    damaged (garbage in a shard), `--resume ckpt` falls back to the one at 4 with one warning line,
    under the same plan and under another (TP 3 + TP 1 stages, uneven TP splits, a migrated
    micro-batch, a standby device): iterations 4..5 equal the uninterrupted run's (and the
    reference's) losses at 1e-5 relative."""
    ckpt = str(tmp_path / "ckpt")
    plan = Plan.uniform(SPEC, 2, 2, 2, 2)
    config = TrainConfig(
        seq_len=32, microbatches=2, iterations=6, checkpoint_every=2, checkpoint_dir=ckpt, keep_checkpoints=2,
        detect_slow=False,
    )  # a quiet run: its events are exactly the checkpoints  # fmt: skip
    full = run_training(config, plan, progress=False)
    losses = [r["loss"] for r in full["iterations"]]
    ref, _ = reference_for(plan, config)
    assert losses == pytest.approx(ref, rel=1e-5)
    assert [(e["iter"], e["kind"]) for e in full["events"]] == [(k, "checkpoint") for k in (2, 4, 6)]
    assert newest_usable(ckpt)[0] == iter_dir(ckpt, 6)
    assert sorted(os.listdir(ckpt)) == ["iter_00000004", "iter_00000006", "latest"]  # retention
    meta = load_meta(iter_dir(ckpt, 4))
    assert meta["iteration"] == 4 and meta["plan"] == plan.to_dict() and meta["savers"] == [0, 1, 2, 3]
    assert sorted(os.listdir(iter_dir(ckpt, 4))) == [".metadata", "dev0", "dev1", "dev2", "dev3", "meta.json"]
    shard = os.path.join(iter_dir(ckpt, 6), "dev1", "__0_0.distcp")
    with open(shard, "r+b") as f:
        f.write(b"garbage!")
    pids = full["worker_pids"]

    again = TrainConfig(seq_len=32, microbatches=2, iterations=6)
    same = run_training(again, plan, progress=False, resume=ckpt)
    assert [r["iter"] for r in same["iterations"]] == [4, 5]
    assert [r["loss"] for r in same["iterations"]] == pytest.approx(losses[4:], rel=1e-5)

    r0 = (Stage((0, 1, 2), (0, 1), (3, 3, 2), (20, 16, 12)), Stage((3,), (1, 4), (8,), (48,)))
    r1 = (Stage((4,), (0, 1), (8,), (48,)), Stage((5, 6), (1, 4), (5, 3), (10, 38)))
    other = Plan(SPEC, (r0, r1), (2, 2), "1f1b", assignment=((0, 1, 1, 1),), standby=(7,))
    moved = run_training(again, other, progress=False, resume=iter_dir(ckpt, 4))
    assert [r["iter"] for r in moved["iterations"]] == [4, 5]
    assert [r["loss"] for r in moved["iterations"]] == pytest.approx(losses[4:], rel=1e-5)
    assert alive(pids + same["worker_pids"] + moved["worker_pids"]) == [], "orphan worker processes"


@pytest.mark.slow
def test_no_live_copy_restarts_from_the_newest_checkpoint(tmp_path):
    """Devices 0 and 4 (TP rank 0 of stage 0 in both replicas) stop in iteration 3: no survivor holds
    that shard and there are no snapshots, so the job restarts from its checkpoint at 2 on the six
    survivors (event `restart`), runs iterations 2.. again, and every loss equals the fault-free
    reference; without a checkpoint the same failure ends the job (WorkerFailed, one line)."""
    faults = tmp_path / "faults.toml"
    faults.write_text("".join(f"[[faults]]\nkind = 'stop'\ndevice = {d}\nat_iter = 3\n" for d in (0, 4)))
    plan = Plan.uniform(SPEC, 2, 2, 2, 2)
    ckpt = str(tmp_path / "ckpt")
    config = TrainConfig(
        seq_len=32, microbatches=2, iterations=5, checkpoint_every=2, checkpoint_dir=ckpt, faults=str(faults),
        detect_slow=False,
    )  # fmt: skip
    out = run_training(config, plan, progress=False)
    ref, _ = reference_for(plan, config)
    assert [r["iter"] for r in out["iterations"]] == [0, 1, 2, 3, 4]
    assert [r["loss"] for r in out["iterations"]] == pytest.approx(ref, rel=1e-5)
    restart = [e for e in out["events"] if e["kind"] == "restart"]
    assert len(restart) == 1 and restart[0]["to_iter"] == 2 and restart[0]["checkpoint"] == iter_dir(ckpt, 2)
    assert not {0, 4} & set(restart[0]["devices"])
    # the trace is the committed history: iteration 2 of generation 0 (rewound) is gone, no repeat
    rows = [(r["iter"], r["generation"], r["device"]) for r in out["trace"]]
    assert rows == sorted(rows) and len(set(rows)) == len(rows)
    assert [(it, len({g for i, g, _ in rows if i == it})) for it in range(5)] == [(it, 1) for it in range(5)]
    assert {d for it, g, d in rows if it >= 2} == set(restart[0]["devices"])
    assert alive(out["worker_pids"]) == [], "orphan worker processes"
