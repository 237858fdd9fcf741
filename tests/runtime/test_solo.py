"""The executor's numerics on one in-process member (`exec/solo.py`): bf16 mixed precision,
activation checkpointing, injected fail-slow, and the host-side figures it reports."""

import dataclasses
import statistics
import time

import pytest
import torch

from resihp.core.model_spec import ModelSpec
from resihp.core.plan import Plan
from resihp.core.program import compile_plan
from resihp.runtime.config import TrainConfig
from resihp.runtime.exec import slow
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


def _injected(schedule: str, monkeypatch) -> dict[str, list[tuple[float, float, float]]]:
    """Per op, for each instruction of the slowed (odd) iterations at p = 0.5: (its compute time t
    when the injection starts, the injected seconds, its row's compute_s). An op that got no
    injection has no entries."""
    plan, _, job = _job(schedule, iterations=6)
    instrs = compile_plan(plan).instructions(0)
    seen: dict[tuple[int, int], list[float]] = {}
    state: dict = {}
    wait, after = slow.busy_wait, slow.Slowdown.after

    def spy_wait(seconds: float) -> None:
        seen[state["it"], state["k"]].append(seconds)
        wait(seconds)

    def spy_after(self, k, start, p):
        wall, comm = self.clock.split(start, self.clock.mark())
        state["k"], seen[state["it"], k] = k, [wall - comm]
        after(self, k, start, p)

    def speed(it: int) -> float:
        state["it"] = it
        return 0.5 if it % 2 else 1.0

    monkeypatch.setattr(slow, "busy_wait", spy_wait)
    monkeypatch.setattr(slow.Slowdown, "after", spy_after)
    res = run_solo(plan, job, hooks=Hooks(slow=speed))
    out: dict[str, list[tuple[float, float, float]]] = {}
    for rec in res.records:
        for k, ins in enumerate(instrs):
            if (rec["iter"], k) in seen:
                t, extra = seen[rec["iter"], k]
                out.setdefault(ins.op, []).append((t, extra, rec["instrs"][k].compute_s))
    assert all(it % 2 for it, _ in seen), "a healthy iteration was slowed"
    return out


def test_injected_slowness_is_busy_device_work_and_spares_no_ops(monkeypatch):
    """At p = 0.5 each F and B gets a busy-wait of its own compute time t (t·(1/p − 1)), counted in
    its row; 1F1B's W, which does no work (B made the weight gradients), gets nothing; under zbh1 W
    does and gets it, and the first stage's B, with no input gradient to make, does not. The wait
    computes: it holds the CPU, where a sleep gives it away."""
    got = _injected("1f1b", monkeypatch)
    assert sorted(got) == ["B", "F"], sorted(got)
    for op, rows in got.items():
        for t, extra, compute_s in rows:
            assert extra == pytest.approx(t, rel=0.05, abs=20e-6), (op, t, extra)
            assert compute_s >= t + extra, (op, t, extra, compute_s)
    got = _injected("zbh1", monkeypatch)
    assert sorted(got) == ["F", "W"], sorted(got)
    cpu = time.process_time()
    slow.busy_wait(0.05)
    spent = time.process_time() - cpu
    time.sleep(0.05)
    assert spent > 0.005 and time.process_time() - cpu - spent < 0.003, spent


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_member_matches_the_cpu_reference():
    """fp32 on the GPU: losses within 1e-4 (relative) of the CPU oracle, timings from CUDA events."""
    plan, config, job = _job(iterations=5)
    res = run_solo(plan, dataclasses.replace(job, device="cuda", backend="nccl"))
    ref = reference_for(plan, config)[0]
    assert max(abs(a - b) / b for a, b in zip(res.losses, ref)) <= 1e-4
    assert all(r.compute_s >= 0 for rec in res.records for r in rec["instrs"])
