"""Periodic checkpoints and whole-job restarts (`resihp train --resume DIR`): the resumed loss
trajectory continues the uninterrupted one exactly, on the same or on a different plan."""

import os

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
    cfg = TrainConfig.from_dict({"run": {"checkpoint_every": 5, "checkpoint_dir": "ck"}})
    assert (cfg.checkpoint_every, cfg.checkpoint_dir) == (5, "ck")
    with pytest.raises(ValueError, match="no complete checkpoint"):
        newest_usable(str(tmp_path))
    with pytest.raises(ValueError, match="no complete checkpoint"):
        run_training(TrainConfig(iterations=2), progress=False, resume=str(tmp_path))


@pytest.mark.slow
def test_resume_continues_the_loss_trajectory_on_the_same_and_another_plan(tmp_path):
    """6 iterations with a checkpoint every 3; resume from the one at 3 under the same plan and
    under another (TP 3 + TP 1 stages, uneven TP splits, a migrated micro-batch, a standby
    device): iterations 3..5 equal the uninterrupted run's (and the reference's) losses at 1e-5
    relative."""
    ckpt = str(tmp_path / "ckpt")
    plan = Plan.uniform(SPEC, 2, 2, 2, 2)
    config = TrainConfig(
        seq_len=32, microbatches=2, iterations=6, checkpoint_every=3, checkpoint_dir=ckpt, detect_slow=False
    )  # a quiet run: its events are exactly the checkpoints
    full = run_training(config, plan, progress=False)
    losses = [r["loss"] for r in full["iterations"]]
    ref, _ = reference_for(plan, config)
    assert losses == pytest.approx(ref, rel=1e-5)
    assert [(e["iter"], e["kind"]) for e in full["events"]] == [(3, "checkpoint"), (6, "checkpoint")]
    assert newest_usable(ckpt)[0] == iter_dir(ckpt, 6)
    meta = load_meta(iter_dir(ckpt, 3))
    assert meta["iteration"] == 3 and meta["plan"] == plan.to_dict() and meta["savers"] == [0, 1, 2, 3]
    assert sorted(os.listdir(iter_dir(ckpt, 3))) == [".metadata", "dev0", "dev1", "dev2", "dev3", "meta.json"]
    pids = full["worker_pids"]

    again = TrainConfig(seq_len=32, microbatches=2, iterations=6)
    same = run_training(again, plan, progress=False, resume=iter_dir(ckpt, 3))
    assert [r["iter"] for r in same["iterations"]] == [3, 4, 5]
    assert [r["loss"] for r in same["iterations"]] == pytest.approx(losses[3:], rel=1e-5)

    r0 = (Stage((0, 1, 2), (0, 1), (3, 3, 2), (20, 16, 12)), Stage((3,), (1, 4), (8,), (48,)))
    r1 = (Stage((4,), (0, 1), (8,), (48,)), Stage((5, 6), (1, 4), (5, 3), (10, 38)))
    other = Plan(SPEC, (r0, r1), (2, 2), "1f1b", assignment=((0, 1, 1, 1),), standby=(7,))
    moved = run_training(again, other, progress=False, resume=iter_dir(ckpt, 3))
    assert [r["iter"] for r in moved["iterations"]] == [3, 4, 5]
    assert [r["loss"] for r in moved["iterations"]] == pytest.approx(losses[3:], rel=1e-5)
    assert alive(pids + same["worker_pids"] + moved["worker_pids"]) == [], "orphan worker processes"
