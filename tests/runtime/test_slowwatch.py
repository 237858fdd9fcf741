"""Live fail-slow detection: injected slowdown -> fail-slow event naming the device -> uneven TP replan."""

import pytest

from resihp.core.model_spec import ModelSpec
from resihp.core.plan import Plan
from resihp.runtime.config import TrainConfig
from resihp.runtime.launch import alive
from resihp.runtime.reference import train_reference
from resihp.runtime.train import run_training

pytestmark = pytest.mark.slow

SPEC = ModelSpec("t", 4, 32, 8, 2, 48, 256)


def test_slow_device_is_detected_and_its_tp_stage_rebalanced(tmp_path):
    """tp2 x pp1 x dp2; device 1 computes 4x slower from iteration 2: the controller blames device 1
    (severity well below 1) from compute-only timings, re-splits its stage so device 1 gets fewer
    heads, and the losses still equal the reference."""
    faults = tmp_path / "faults.toml"
    faults.write_text("[[faults]]\nkind = 'slow'\ndevice = 1\nat_iter = 2\nseverity = 0.25\n")
    config = TrainConfig(seq_len=32, microbatches=2, iterations=6, faults=str(faults))
    plan = Plan.uniform(SPEC, 2, 1, 2, 2)
    res = run_training(config, plan, progress=False, detect_slow=True)
    ref_losses, _ = train_reference(
        SPEC,
        config.workload(),
        plan.global_microbatches,
        config.iterations,
        seed=config.seed,
        optim=config.optim(),
    )
    assert [row["loss"] for row in res["iterations"]] == pytest.approx(ref_losses, rel=1e-4)
    slow = [e for e in res["events"] if e["kind"] == "fail-slow"]
    assert [e["devices"] for e in slow] == [[1]], res["events"]
    assert slow[0]["iter"] >= 2 and slow[0]["severity"] < 0.6
    final = res["plans"][-1]["replicas"][0][0]
    assert final["devices"] == [0, 1] and final["tp_split"][1] < final["tp_split"][0]
    assert res["iterations"][-1]["generation"] == 1
    assert alive(res["worker_pids"]) == [], "orphan worker processes"
