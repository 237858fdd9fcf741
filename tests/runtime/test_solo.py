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


def _slowdowns(schedule: str) -> dict[str, float]:
    """Per op, (median over slowed iterations) / (median over healthy ones) of the iteration's summed
    compute of that op; odd iterations run at p = 0.5, so both kinds see the machine's load of the
    same minutes. Also that ratio of the process's CPU time, and the W rows' median seconds."""
    plan, _, job = _job(schedule, iterations=16)
    res = run_solo(plan, job, hooks=Hooks(slow=lambda it: 0.5 if it % 2 else 1.0))
    halves = (res.records[2::2], res.records[3::2])  # healthy, slowed (the first two warm up)

    def med(recs, fn):
        return statistics.median(fn(rec) for rec in recs)

    out = {}
    for op in ("F", "B", "W"):
        total = lambda rec, op=op: sum(r.compute_s for r in rec["instrs"] if r.op == op)  # noqa: E731
        out[op] = med(halves[1], total) / med(halves[0], total)
    out["cpu"] = med(halves[1], lambda rec: rec["cpu_s"]) / med(halves[0], lambda rec: rec["cpu_s"])
    for name, recs in (("W_healthy_s", halves[0]), ("W_slowed_s", halves[1])):
        out[name] = statistics.median(r.compute_s for rec in recs for r in rec["instrs"] if r.op == "W")
    return out


def test_injected_slowness_is_busy_device_work_and_spares_no_ops():
    """At p = 0.5 the process computes about twice as long (CPU time: a busy-wait, not a sleep, and
    the figure that preemption on shared cores does not blur), F and B take longer on the wall clock,
    1F1B's W, which does no work, gets nothing added, and zbh1's W, which does, is slowed."""
    got = _slowdowns("1f1b")
    assert 1.6 < got["cpu"] < 2.6, got
    assert got["F"] > 1.3 and got["B"] > 1.3, got
    assert got["W_slowed_s"] < got["W_healthy_s"] + 20e-6, got  # a no-op (~10 us)
    got = _slowdowns("zbh1")
    assert 1.6 < got["cpu"] < 2.6 and got["W"] > 1.3, got


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_member_matches_the_cpu_reference():
    """fp32 on the GPU: losses within 1e-4 (relative) of the CPU oracle, timings from CUDA events."""
    plan, config, job = _job(iterations=5)
    res = run_solo(plan, dataclasses.replace(job, device="cuda", backend="nccl"))
    ref = reference_for(plan, config)[0]
    assert max(abs(a - b) / b for a, b in zip(res.losses, ref)) <= 1e-4
    assert all(r.compute_s >= 0 for rec in res.records for r in rec["instrs"])
