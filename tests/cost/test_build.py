"""build_costs: per-device shares, stragglers inside a TP group, and agreement with the DAG simulator."""

import numpy as np
import pytest

from resihp.core import Cluster, Plan, build_stage, model_preset
from resihp.core.program import compile_plan
from resihp.cost import build_costs, capacity_bound, hardware_preset
from resihp.cost.flops import C_ATT_TIME, chunk_flops
from resihp.evaluator.pipeline import evaluate

L7 = model_preset("llama2-7b")
S = 8192


def _batch(plan, n=S, sq=S * S):
    g = plan.global_microbatches
    return np.full(g, float(n)), np.full(g, float(sq))


def _chunk_s(costs, g, kind, n=S, sq=S * S):
    c0, alpha, beta = costs.chunk[g][kind]
    return c0 + alpha * n + beta * sq


def test_healthy_chunk_time_is_flops_over_achieved_rate():
    """Without TP, a middle stage's W chunk takes its FLOPs at efficiency·peak plus no communication."""
    plan = Plan.uniform(L7, 1, 4, 1, 4)
    costs = build_costs(L7, plan, Cluster(1, 4, "a100-80g"), *_batch(plan), tp_exposed=0.0)
    hw = hardware_preset("a100-80g")
    expected = chunk_flops(L7, 8, S, S * S, 2, c_att=C_ATT_TIME) / hw.achieved_flops
    assert _chunk_s(costs, (0, 1), 2) == pytest.approx(expected)
    assert _chunk_s(costs, (0, 1), 0) > expected  # F adds the memory-bound per-token work


@pytest.mark.parametrize("kind", [0, 1, 2])
def test_half_speed_device_doubles_an_even_group(kind):
    """One device at half speed makes its evenly split TP group's chunk exactly twice as slow."""
    cluster = Cluster(1, 8, "a100-80g")
    plan = Plan.uniform(L7, 4, 2, 1, 4)
    healthy = build_costs(L7, plan, cluster, *_batch(plan), tp_exposed=0.0)
    slow = build_costs(L7, plan, cluster.with_speed(2, 0.5), *_batch(plan), tp_exposed=0.0)
    assert _chunk_s(slow, (0, 0), kind) == pytest.approx(2 * _chunk_s(healthy, (0, 0), kind))
    assert _chunk_s(slow, (0, 1), kind) == pytest.approx(_chunk_s(healthy, (0, 1), kind))


@pytest.mark.parametrize("kind", [0, 1, 2])
def test_speed_proportional_split_runs_at_the_mean_speed(kind):
    """With heads and FFN columns split in proportion to speed, the group slows only to its mean speed.

    Speeds (1, 0.6) split 32 heads 20/12 and 11,008 FFN columns 6,880/4,128 exactly, so only the
    evenly split per-token work (norms on sequence shards) keeps the ratio off 1/0.8 by a little.
    """
    speeds = (1.0, 0.6)
    cluster = Cluster(1, 4, "a100-80g").with_speed(1, 0.6)
    even = Plan.uniform(L7, 2, 2, 1, 4)
    stages = (build_stage(L7, (0, 1), (0, 16), speeds), even.replicas[0][1])
    assert stages[0].tp_split == (20, 12) and stages[0].ffn_split == (6880, 4128)
    plan = Plan(L7, (stages,), (4,))
    healthy = build_costs(L7, even, Cluster(1, 4, "a100-80g"), *_batch(even), tp_exposed=0.0)
    balanced = build_costs(L7, plan, cluster, *_batch(plan), tp_exposed=0.0)
    ratio = _chunk_s(balanced, (0, 0), kind) / _chunk_s(healthy, (0, 0), kind)
    assert ratio == pytest.approx(1 / np.mean(speeds), rel=0.02)


def test_uniform_1f1b_matches_closed_form():
    """On uneven stages, 1F1B iteration ≈ Σ_s τ_s + (m−1)·max τ (P2P and step aside) within 3%."""
    m = 8
    cluster = Cluster(1, 8, "a100-80g")
    plan = Plan.uniform(L7, 2, 4, 1, m, layer_split=(6, 8, 8, 10))
    costs = build_costs(L7, plan, cluster, *_batch(plan))
    result = evaluate(compile_plan(plan), costs)
    tau = [sum(_chunk_s(costs, (0, i), k) for k in range(3)) for i in range(4)]
    closed = sum(tau) + (m - 1) * max(tau)
    assert result.iteration_s - costs.step_s == pytest.approx(closed, rel=0.03)


def test_peak_memory_reported_per_device():
    """The simulator's peak memory on stage 0 is static + 1F1B's p live micro-batches of activations."""
    cluster = Cluster(4, 8, "a100-80g")
    plan = Plan.uniform(model_preset("llama2-13b"), 4, 4, 2, 8)
    costs = build_costs(plan.model, plan, cluster, *_batch(plan, 16384, 16384**2))
    result = evaluate(compile_plan(plan), costs)
    assert result.peak_memory_bytes[0] / 1e9 == pytest.approx(37.0, abs=0.1)
    assert costs.segment_s[(0, 10)] > 0 and costs.step_s > 0 and costs.send_blocks


def test_dead_device_in_plan_is_a_caller_bug():
    """A plan that uses a dead device is a bug in the caller, caught by an assertion."""
    plan = Plan.uniform(L7, 1, 2, 1, 2)
    with pytest.raises(AssertionError, match="dead"):
        build_costs(L7, plan, Cluster(1, 2, "h100").with_alive(1, False), *_batch(plan))


def test_unknown_hardware_lists_the_presets():
    """An unknown GPU name raises ValueError naming the allowed presets."""
    with pytest.raises(ValueError, match="a100-40g, a100-80g, h100, h800, h200, cpu"):
        hardware_preset("tpu")


def test_a_cluster_can_carry_a_concrete_hardware():
    """`Cluster.gpu` may be a Hardware: `hardware_preset` returns it unchanged and the costs equal
    those built with it passed explicitly; invalid fields raise ValueError naming the key."""
    hw = hardware_preset("cpu").with_changes(name="cpu-calibrated", peak_flops=1e9)
    assert hardware_preset(hw) is hw
    plan = Plan.uniform(L7, 1, 2, 1, 2)
    on_cluster = build_costs(L7, plan, Cluster(1, 2, hw), *_batch(plan))
    explicit = build_costs(L7, plan, Cluster(1, 2, "cpu"), *_batch(plan), hw)
    assert all(np.array_equal(on_cluster.chunk[g], explicit.chunk[g]) for g in explicit.chunk)
    for key, bad in (
        ("p2p_bw", 0.0),
        ("alpha_p2p_s", -1.0),
        ("layer_overhead_s", -1e-3),
        ("alpha_intra_s", -1.0),
    ):
        with pytest.raises(ValueError, match=f"hardware.{key}"):
            hw.with_changes(**{key: bad})


@pytest.mark.parametrize("kind", [0, 1, 2])
def test_layer_overhead_is_per_layer_per_device_in_f_and_b(kind):
    """`layer_overhead_s` adds L x overhead to F and B (not W), unshared by TP, divided by speed."""
    hw = hardware_preset("cpu")
    slow = hw.with_changes(layer_overhead_s=1e-3)
    plan = Plan.uniform(L7, 2, 2, 1, 2)
    cluster = Cluster(1, 4, "cpu").with_speed(1, 0.5)
    base = build_costs(L7, plan, cluster, *_batch(plan), hw, tp_exposed=0.0)
    more = build_costs(L7, plan, cluster, *_batch(plan), slow, tp_exposed=0.0)
    extra = 16 * 1e-3 if kind < 2 else 0.0
    assert _chunk_s(more, (0, 1), kind) - _chunk_s(base, (0, 1), kind) == pytest.approx(extra)
    assert _chunk_s(more, (0, 0), kind) - _chunk_s(base, (0, 0), kind) == pytest.approx(extra / 0.5)


def test_capacity_bound_counts_live_speed():
    """One GPU lost from 16 gives 15/16 of the fault-free rate; a half-speed one counts as half."""
    cluster = Cluster(2, 8).with_alive(3, False)
    assert capacity_bound(8.0, cluster, 16) == pytest.approx(7.5)
    assert capacity_bound(8.0, cluster.with_speed(4, 0.5), 16) == pytest.approx(8.0 * 14.5 / 16)


def test_16k_gpu_plan_covers_every_group_and_device():
    """Costs for a 16,384-GPU layout (TP 8, PP 16, DP 128) cover every group and device."""
    model = model_preset("llama3-405b")
    plan = Plan.uniform(model, 8, 16, 128, 16)
    costs = build_costs(model, plan, Cluster(2048, 8, "h100"), *_batch(plan))
    assert len(costs.chunk) == 2048 and len(costs.mem_static) == 16384


def test_tp_collectives_in_f_and_b_only():
    """Exposed TP collectives add to F and B of a TP group but never to W."""
    plan = Plan.uniform(L7, 4, 2, 1, 4)
    cluster = Cluster(1, 8, "h100")
    exposed = build_costs(L7, plan, cluster, *_batch(plan))
    hidden = build_costs(L7, plan, cluster, *_batch(plan), tp_exposed=0.0)
    extra = [_chunk_s(exposed, (0, 0), k) - _chunk_s(hidden, (0, 0), k) for k in range(3)]
    assert extra[0] == pytest.approx(extra[1]) and extra[0] > 0 and extra[2] == 0


def test_uniform_plan_reduces_one_segment_per_stage():
    """A uniform plan's segments are its stages: each priced once for all its replicas, exposing
    only the last bucket; every device hands its whole shard (fp32 gradients) to the all-reduce;
    DP 1 reduces nothing."""
    cluster = Cluster(4, 8, "a100-80g")
    plan = Plan.uniform(L7, 4, 2, 4, 4)
    costs = build_costs(L7, plan, cluster, *_batch(plan))
    assert set(costs.segment_s) == {(0, 16), (16, 32)} and costs.segment_s[(16, 32)] > 0
    whole = build_costs(L7, plan, cluster, *_batch(plan), dp_exposed_fraction=1.0)
    assert whole.segment_s[(16, 32)] > 5 * costs.segment_s[(16, 32)]  # only the last bucket is exposed
    h, v, f, kv = L7.hidden, L7.vocab, L7.ffn, L7.kv_heads * L7.head_dim
    layer = (2 * h * h + 2 * kv * h) / 4 + 3 * h * f / 4 + 2 * h  # one TP-4 rank's share of a layer
    assert costs.allreduce_bytes[0] == 4 * (16 * layer + v * h / 4)  # stage 0: layers + embedding
    assert costs.allreduce_bytes[4] == 4 * (16 * layer + v * h / 4 + h)  # stage 1: + LM head and norm
    assert len(costs.allreduce_bytes) == 32
    single = Plan.uniform(L7, 4, 2, 1, 4)
    one = build_costs(L7, single, cluster, *_batch(single))
    assert one.segment_s == {} and one.allreduce_bytes == {}


def test_cpu_preset_costs_a_tiny_model():
    """The placeholder CPU preset gives finite, positive chunk times for the tiny runtime model."""
    tiny = model_preset("tiny")
    plan = Plan.uniform(tiny, 2, 2, 1, 2)
    costs = build_costs(tiny, plan, Cluster(1, 4, "cpu"), np.full(2, 256.0), np.full(2, 256.0**2))
    times = [_chunk_s(costs, (0, i), k, 256, 256**2) for i in range(2) for k in range(3)]
    assert all(0 < t < 1 for t in times)
