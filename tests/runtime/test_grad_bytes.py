"""The gradient reduction the runtime runs is the one the cost model prices, byte for byte.

One spawn, three plan generations (planned replans at iterations 1 and 2): two plans the `resihp`
policy emits for the tiny GQA model under a slow device (replicas with different TP splits, one
with a migrated micro-batch) and one with different layer partitions per replica and an uneven
split that replicates a kv head, shared by both replicas (a sharded segment with uneven shards).
Each device counts the bytes it hands to its segments' all-reduces (`allreduce_bytes` in the
trace); `build_costs` prices the same plan for the runtime's layout (embedding and LM head whole
on every TP rank: `vocab_parallel=False`).
"""

import numpy as np
import pytest

from resihp.core import Cluster, Plan, Stage, Workload, model_preset
from resihp.core.scenario import Job
from resihp.core.segments import grad_segments
from resihp.cost import build_costs
from resihp.runtime.config import TrainConfig
from resihp.runtime.control.pids import alive
from resihp.runtime.reference import reference_for
from resihp.runtime.train import run_training
from resihp.sched import PlanningContext, ResiHP

pytestmark = pytest.mark.slow

SPEC = model_preset("tiny-gqa")  # 6 layers, 6 heads, 2 kv heads, FFN 256
M = 8


def _policy_plan(device: int, speed: float) -> Plan:
    job = Job(SPEC, Cluster(1, 8, "cpu"), Workload(32, M), 2, 2, 2)
    ctx = PlanningContext.of_job(job)
    return ResiHP().adapt(ctx, ctx.home, job.cluster.with_speed(device, speed), []).plan


def _plans() -> list[Plan]:
    slow2, slow5 = _policy_plan(2, 0.5), _policy_plan(5, 0.5)
    r0 = (Stage((0, 1), (0, 2), (4, 2), (170, 86)), Stage((2, 3), (2, 6), (2, 4), (86, 170)))
    r1 = (Stage((4, 5), (0, 3), (3, 3), (128, 128)), Stage((6, 7), (3, 6), (2, 4), (86, 170)))
    cut = Plan(SPEC, (r0, r1), (M, M), "1f1b")
    return [p.with_changes(generation=0, schedule="1f1b") for p in (slow2, slow5, cut)]


def test_runtime_reduces_exactly_the_priced_bytes():
    """Per device and plan, the bytes the workers all-reduce equal `Costs.allreduce_bytes`; the
    plans cover full and sharded segments, migration and uneven layer cuts; losses match the
    single-process reference."""
    plans = _plans()
    kinds = {(seg.sharded, len(seg.groups)) for p in plans for seg in grad_segments(p)}
    assert (False, 2) in kinds and (True, 2) in kinds  # full and sharded reductions both run
    assert plans[1].assignment and plans[0].replicas[0][1].tp_split != plans[0].replicas[1][1].tp_split
    assert plans[2].replicas[0][0].layers != plans[2].replicas[1][0].layers
    config = TrainConfig(model="tiny-gqa", seq_len=32, microbatches=M, iterations=3)
    res = run_training(config, plans[0], progress=False, replans=[(1, plans[1]), (2, plans[2])])
    tokens = np.full(2 * M, 32.0)
    for it, plan in enumerate(plans):
        priced = build_costs(SPEC, plan, Cluster(1, 8, "cpu"), tokens, tokens**2, vocab_parallel=False)
        counted = {r["device"]: r["allreduce_bytes"] for r in res["trace"] if r["iter"] == it}
        assert set(counted) == set(plan.devices())
        assert counted == {d: priced.allreduce_bytes.get(d, 0.0) for d in plan.devices()}, it
        assert all(counted.values())
    ref_losses, _ = reference_for(plans[0], config)
    assert [row["loss"] for row in res["iterations"]] == pytest.approx(ref_losses, rel=1e-5)
    assert alive(res["worker_pids"]) == [], "orphan worker processes"
