"""Gradient segments at scale (torch-free): the cost model prices exactly what the Program reduces.

Plans come from the `resihp` policy under faults. The expected bytes are recounted here from the
model's tensor shapes (each tensor sharded by query heads, kv heads, FFN columns or not at all),
independently of `cost.memory.shard_params`.
"""

import numpy as np
import pytest

from resihp.core import Cluster, Workload, model_preset
from resihp.core.program import compile_plan
from resihp.core.scenario import Job
from resihp.cost import build_costs
from resihp.evaluator.pipeline import evaluate
from resihp.sched import PlanningContext, ResiHP


def _tensors(model, layers: int, embedding: bool, head: bool):
    """(elements, sharded by) of every tensor of `layers` layers (+ embedding, + norm and LM head)."""
    h, hd, kv = model.hidden, model.head_dim, model.kv_heads * model.head_dim
    q = model.heads * hd
    per_layer = [(h, None), (q * h, "q"), (kv * h, "kv"), (kv * h, "kv"), (h * q, "q"), (h, None)]
    per_layer += [(model.ffn * h, "ffn")] * 3
    if model.qkv_bias:
        per_layer += [(q, "q"), (kv, "kv"), (kv, "kv")]
    out = per_layer * layers
    if embedding:
        out.append((model.vocab * h, "vocab"))
    if head:
        out += [(h, None), (model.vocab * h, "vocab")]
    return out


def _shard_elements(model, stage, rank, layers, embedding, head, full: bool) -> float:
    if full:
        return float(sum(n for n, _ in _tensors(model, layers, embedding, head)))
    q0 = sum(stage.tp_split[:rank])
    q1 = q0 + stage.tp_split[rank]
    group = model.heads // model.kv_heads
    kv_held = (q1 - 1) // group + 1 - q0 // group
    share = {
        None: 1.0,
        "q": (q1 - q0) / model.heads,
        "kv": kv_held / model.kv_heads,
        "ffn": stage.ffn_split[rank] / model.ffn,
        "vocab": 1.0 / stage.tp,
    }
    return sum(n * share[by] for n, by in _tensors(model, layers, embedding, head))


def _policy_plan(preset, tp, pp, dp, faults, nodes, gpu="a100-80g", m=8):
    job = Job(model_preset(preset), Cluster(nodes, 8, gpu), Workload(8192, m), tp, pp, dp)
    cluster = job.cluster
    for dev, speed in faults:
        cluster = cluster.with_speed(dev, speed) if speed else cluster.with_alive(dev, False)
    ctx = PlanningContext.of_job(job)
    decision = ResiHP().adapt(ctx, ctx.home, cluster, [])
    return job, cluster, decision.plan


CASES = [
    ("llama2-13b", 4, 4, 2, [(5, 0.5)], 4),  # the issue's plan: layer splits 11,9,11,9 vs 10 x 4
    ("llama2-13b", 4, 4, 2, [(5, 0.3), (20, None)], 4),
    ("qwen2.5-14b", 4, 4, 2, [(2, 0.5), (13, 0.6)], 4),
    ("llama2-70b", 4, 16, 4, [(90, None), (130, 0.5), (251, 0.3)], 32),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{len(c[4])}faults" for c in CASES])
def test_priced_bytes_are_the_programs_segments(case):
    """Every device's priced all-reduce bytes are 4 (fp32 gradients) x the elements of the
    segments its ALLREDUCE names, in its shard (sharded) or unsharded (full) layout; every segment
    with two or more holders costs time, and its holders finish their sync together."""
    preset, tp, pp, dp, faults, nodes = case
    job, cluster, plan = _policy_plan(preset, tp, pp, dp, faults, nodes)
    model = job.model
    g = plan.global_microbatches
    costs = build_costs(model, plan, cluster, np.full(g, 8192.0), np.full(g, 8192.0**2))
    program = compile_plan(plan)
    expected: dict[int, float] = {}
    for (d, i), _ in program.chunks.items():
        stage = plan.replicas[d][i]
        dev = stage.devices[0]
        segments = next(x for x in program.instructions(dev) if x.op == "ALLREDUCE").segments
        assert [s.layers[0] for s in segments][0] == stage.layers[0]
        assert sum(s.num_layers for s in segments) == stage.num_layers
        for seg in segments:
            if len(seg.groups) < 2:
                continue
            assert costs.segment_s[seg.layers] > 0
            for r, x in enumerate(stage.devices):
                n = _shard_elements(model, stage, r, seg.num_layers, seg.with_embedding, seg.with_head,
                                    not seg.sharded)  # fmt: skip
                expected[x] = expected.get(x, 0.0) + 4 * n
    assert expected.keys() == costs.allreduce_bytes.keys()
    for x, n in expected.items():
        assert costs.allreduce_bytes[x] == pytest.approx(n, rel=1e-12)
    ends = evaluate(program, costs).group_end_s
    for seg in program.segments:
        last = [h for h in seg.groups if program.segments_of(h)[-1] == seg]
        assert len({ends[h] for h in last}) <= 1


def test_the_issues_plan_prices_every_gradient_group():
    """llama2-13b TP 4 / PP 4 / DP 2 with device 5 at p = 0.5: `resihp` cuts the replicas
    differently (before, 0 of 8 groups got a gradient-sync cost); now every group's segments are
    priced, the misaligned ones over the unsharded layout."""
    job, cluster, plan = _policy_plan("llama2-13b", 4, 4, 2, [(5, 0.5)], 4)
    cuts = [tuple(st.num_layers for st in r) for r in plan.replicas]
    assert cuts[0] != cuts[1]
    g = plan.global_microbatches
    costs = build_costs(job.model, plan, cluster, np.full(g, 8192.0), np.full(g, 8192.0**2))
    program = compile_plan(plan)
    for grp in program.chunks:
        assert program.segments_of(grp) and all(
            costs.segment_s[s.layers] > 0 for s in program.segments_of(grp)
        )
    assert set(costs.allreduce_bytes) == set(plan.devices())
