"""The executor's numerics on one in-process member (`exec/solo.py`): bf16 mixed precision,
activation checkpointing, injected fail-slow, and the host-side figures it reports."""

import dataclasses
import statistics

import pytest
import torch

from resihp.core.model_spec import ModelSpec
from resihp.core.plan import Plan
from resihp.runtime.config import TrainConfig
from resihp.runtime.exec.iteration import Hooks
from resihp.runtime.exec.solo import run_solo
from resihp.runtime.reference import reference_for

SPEC = ModelSpec("t", 4, 32, 8, 2, 48, 256)


def _job(schedule="1f1b", iterations=3, **run):
    config = TrainConfig(
        tp=1, pp=1, dp=1, workers=1, seq_len=64, microbatches=2, iterations=iterations, **run
    )  # fmt: skip
    plan = Plan.uniform(SPEC, 1, 1, 1, 2, schedule)
    return plan, config, config.job_spec(plan)


def test_fp32_member_equals_the_reference_bitwise():
    """One fp32 member and the single-process oracle agree exactly (same kernels, same order)."""
    plan, config, job = _job(iterations=4)
    assert run_solo(plan, job).losses == reference_for(plan, config)[0]


def test_bf16_stays_within_2_percent_of_fp32_over_30_iterations_and_learns():
    """Same seed, 30 iterations: every bf16 loss within 2 % of fp32's, the loss falls, and the master
    weights, their gradients and AdamW's moments stay fp32."""
    plan, _, job = _job(iterations=30)
    fp32 = run_solo(plan, job).losses
    bf16 = run_solo(plan, dataclasses.replace(job, precision="bf16"))
    worst = max(abs(a - b) / b for a, b in zip(bf16.losses, fp32))
    assert worst <= 0.02, worst
    assert bf16.losses != fp32  # bf16 compute really ran
    assert statistics.mean(bf16.losses[-5:]) < bf16.losses[0] - 0.5, bf16.losses
    w = bf16.worker
    assert all(p.dtype == torch.float32 for p in w.params)
    assert all(s["exp_avg"].dtype == torch.float32 for s in w.opt.state.values())


@pytest.mark.parametrize("schedule", ["1f1b", "zbh1"])
def test_activation_checkpointing_changes_nothing(schedule):
    """Per-block recomputation: losses and final parameters within 1e-6 of the plain run (zbh1:
    the split B / W backward)."""
    plan, _, job = _job(schedule)
    plain = run_solo(plan, job)
    ckpt = run_solo(plan, dataclasses.replace(job, activation_checkpointing=True))
    assert ckpt.worker.model.activation_checkpointing
    assert ckpt.losses == pytest.approx(plain.losses, abs=1e-6)
    for name, p in plain.worker.named.items():
        torch.testing.assert_close(ckpt.worker.named[name], p, atol=1e-6, rtol=0, msg=name)


def _median(records, op, first=1):
    return statistics.median(r.compute_s for rec in records[first:] for r in rec["instrs"] if r.op == op)


def test_injected_slowness_is_busy_device_work_and_spares_no_ops():
    """At p = 0.5 F and B take about twice as long and the process spends that time on the CPU (a
    busy-wait, not a sleep); 1F1B's W, which does no work, is not slowed; zbh1's W is."""
    plan, _, job = _job(iterations=6)
    slow = Hooks(slow=lambda it: 0.5)
    healthy, slowed = run_solo(plan, job), run_solo(plan, job, hooks=slow)
    for op in ("F", "B"):
        ratio = _median(slowed.records, op) / _median(healthy.records, op)
        assert 1.6 < ratio < 2.6, (op, ratio)
    cpu = [sum(r["cpu_s"] for r in res.records[1:]) for res in (healthy, slowed)]
    assert cpu[1] > 1.5 * cpu[0], cpu
    noop = [_median(res.records, "W") for res in (healthy, slowed)]
    assert noop[1] < max(2 * noop[0], 50e-6), noop
    plan, _, job = _job("zbh1", iterations=6)
    ratio = _median(run_solo(plan, job, hooks=slow).records, "W") / _median(run_solo(plan, job).records, "W")
    assert ratio > 1.6, ratio


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_member_matches_the_cpu_reference():
    """fp32 on the GPU: losses within 1e-4 (relative) of the CPU oracle, timings from CUDA events."""
    plan, config, job = _job(iterations=5)
    res = run_solo(plan, dataclasses.replace(job, device="cuda", backend="nccl"))
    ref = reference_for(plan, config)[0]
    assert max(abs(a - b) / b for a, b in zip(res.losses, ref)) <= 1e-4
    assert all(r.compute_s >= 0 for rec in res.records for r in rec["instrs"])
