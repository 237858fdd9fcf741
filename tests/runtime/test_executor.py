"""Parity of the multi-process executor with the single-process reference (loss and parameters).

Each test is one spawn of 7-8 gloo workers that exercises several features at once; the oracle is
`train_reference` on the same micro-batches (fp32: losses atol 1e-5, parameters atol
max(1e-5, 1 % of one AdamW step)).
"""

import json
import subprocess
import sys
import time

import pytest
import torch

from resihp.core.model_spec import ModelSpec
from resihp.core.plan import Plan, Stage
from resihp.core.program import compile_plan
from resihp.detect.trace_io import read_trace
from resihp.runtime import WorkerFailed
from resihp.runtime.config import TrainConfig
from resihp.runtime.control.pids import alive, descendants
from resihp.runtime.reference import reference_for
from resihp.runtime.train import run_training

pytestmark = pytest.mark.slow

# GQA (8 query heads, 2 kv heads): TP 3 over 8 heads puts kv heads on two shards (replicated kv).
SPEC = ModelSpec("t", 4, 32, 8, 2, 48, 256)
ITERS = 3


def _check_parity(plan: Plan, config: TrainConfig) -> dict:
    """Run `plan`, compare every replica's parameters and the loss curve with the reference."""
    res = run_training(config, plan, progress=False, return_state=True)
    ref_losses, ref_state = reference_for(plan, config)
    losses = [row["loss"] for row in res["iterations"]]
    assert losses == pytest.approx(ref_losses, abs=1e-5)
    assert set(res["state"]) == set(range(plan.dp))
    # AdamW turns a ~1e-7 roundoff difference of a gradient whose moments are ~0 into a step of up to
    # lr: parameters agree to a fraction of one step, not to 1e-5 absolute, at larger learning rates.
    atol = max(1e-5, 0.01 * config.lr)
    for d, state in res["state"].items():
        hollow = any(st.hollow for st in plan.replicas[d])
        assert set(state) <= set(ref_state) and (hollow or set(state) == set(ref_state)), d
        for name, value in state.items():
            torch.testing.assert_close(value, ref_state[name], atol=atol, rtol=0, msg=f"replica {d} {name}")
    assert alive(res["worker_pids"]) == [], "orphan worker processes"
    return res


def test_1f1b_uneven_tp_mixed_replicas_and_migration():
    """1F1B with TP 3 (3,3,2 heads) next to TP 1 and TP 2 (5,3), uneven layers, migration both ways,
    chunked P2P between TP groups of different sizes (3 -> 2 links: 2, 1 -> 2: 1)."""
    r0 = (Stage((0, 1, 2), (0, 1), (3, 3, 2), (20, 16, 12)), Stage((3,), (1, 4), (8,), (48,)))
    r1 = (Stage((4,), (0, 1), (8,), (48,)), Stage((5, 6), (1, 4), (5, 3), (10, 38)))
    plan = Plan(SPEC, (r0, r1), (3, 2), "1f1b", assignment=((0, 2, 1, 1), (1, 0, 0, 0)))
    res = _check_parity(plan, TrainConfig(seq_len=32, iterations=ITERS, p2p="chunked"))
    json.dumps({k: v for k, v in res.items() if k != "state"})  # the result is JSON-serialisable
    assert [row["iter"] for row in res["iterations"]] == list(range(ITERS))
    assert all(row["samples"] == 5 and row["time_s"] > 0 for row in res["iterations"])
    trace = res["trace"]
    assert len(trace) == ITERS * 7
    rec = next(r for r in trace if r["device"] == 5 and r["iter"] == 1)
    assert (rec["replica"], rec["stage"], rec["tp_rank"]) == (1, 1, 0)
    ops = [i[0] for i in rec["instrs"]]
    # replica 1 stage 1 runs its own 2 micro-batches plus migrated (0, 2): 3 F, 3 B, 3 W
    assert ops.count("F") == ops.count("B") == ops.count("W") == 3
    assert ops[-2:] == ["ALLREDUCE", "STEP"]
    assert all(i[3] >= 0 and i[4] >= 0 for i in rec["instrs"])
    assert rec["compute_s"] > 0 and rec["comm_s"] > 0


def test_zbh1_three_stages_with_hollow_stage():
    """ZB-H1 over 3 stages (W held back), a hollow stage served by replica 0, and equal uneven TP 2
    splits (5,3 heads: a kv head on both shards) reduced shard by shard across replicas; chunked P2P."""
    r0 = (
        Stage((0,), (0, 1), (8,), (48,)),
        Stage((1, 2), (1, 2), (3, 5), (30, 18)),
        Stage((3, 4), (2, 4), (5, 3), (30, 18)),
    )
    r1 = (Stage((5,), (0, 1), (8,), (48,)), Stage((), (1, 2)), Stage((6, 7), (2, 4), (5, 3), (30, 18)))
    plan = Plan(SPEC, (r0, r1), (3, 2), "zbh1", assignment=((1, 0, 1, 0), (1, 1, 1, 0)))
    _check_parity(plan, TrainConfig(seq_len=32, iterations=ITERS, p2p="chunked"))


def test_gpipe_different_layer_partitions_untimed():
    """GPipe with replicas cut at different layers (gradients reduced per layer segment), timing off."""
    r0 = (Stage((0, 1, 2), (0, 1), (3, 3, 2), (16, 16, 16)), Stage((3,), (1, 4), (8,), (48,)))
    r1 = (Stage((4, 5), (0, 3), (6, 2), (40, 8)), Stage((6,), (3, 4), (8,), (48,)))
    plan = Plan(SPEC, (r0, r1), (2, 2), "gpipe")
    res = _check_parity(plan, TrainConfig(seq_len=32, iterations=ITERS, timing=False))
    assert all(rec["instrs"] == [] and rec["wall_s"] > 0 for rec in res["trace"])


def test_default_layout_tp2_pp2_dp2_with_trace_file(tmp_path):
    """The default job's layout (tiny, tp 2 x pp 2 x dp 2, 1F1B) matches the reference; the trace
    file holds one JSON line per device and iteration, streamed in (iteration, device) order (the
    result's trace is read back from it)."""
    path = tmp_path / "trace.jsonl"
    config = TrainConfig(seq_len=32, microbatches=2, iterations=ITERS, trace=str(path))
    res = _check_parity(config.plan(), config)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    keys = [(r["iter"], r["device"]) for r in lines]
    assert keys == [(k, d) for k in range(ITERS) for d in range(8)] and lines == res["trace"]
    program = compile_plan(config.plan())
    for rec in read_trace(str(path)):  # the detector's reader: entry k is instruction k of the Program
        want = [(i.op, i.src, i.mb) for i in program.instructions(rec.device)]
        assert [(row.op, row.src, row.mb) for row in rec.instrs] == want
    assert {(r["replica"], r["stage"], r["tp_rank"]) for r in lines if r["iter"] == 0} == {
        (d, i, t) for d in range(2) for i in range(2) for t in range(2)
    }


def test_unrecoverable_stop_is_blamed_and_every_child_reaped(tmp_path):
    """A worker that exits hard holding the only copy of its stage (dp 1, no snapshots): WorkerFailed
    names it and the missing tensor, and no process survives."""
    faults = tmp_path / "faults.toml"
    faults.write_text("[[faults]]\nkind = 'stop'\ndevice = 1\nat_iter = 1\n")
    plan = Plan.uniform(SPEC, 1, 2, 1, 2)
    cfg = TrainConfig(seq_len=32, iterations=3, faults=str(faults))
    with pytest.raises(WorkerFailed, match=r"devices \[1\] stopped at iteration 1.*run\.snapshots") as info:
        run_training(cfg, plan, progress=False)
    assert info.value.devices == [1]
    assert alive(info.value.pids) == []


def test_sigkilled_controller_leaves_no_workers():
    """Workers notice their controller's death (even SIGKILL) and exit within seconds."""
    code = (
        "from resihp.runtime.config import TrainConfig\n"
        "from resihp.runtime.train import run_training\n"
        "if __name__ == '__main__':\n"
        "    run_training(TrainConfig(tp=1, pp=2, dp=1, workers=2, seq_len=32, iterations=10**6))\n"
    )
    ctrl = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    try:
        line = ctrl.stderr.readline()  # the first progress line: workers are running
        assert line.startswith("iter 1/"), line
        family = set(descendants(ctrl.pid))
        assert len(family) >= 2
    finally:
        ctrl.kill()
        ctrl.wait()
    deadline = time.monotonic() + 10
    while alive(sorted(family)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert alive(sorted(family)) == []
