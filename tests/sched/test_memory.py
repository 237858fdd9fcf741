"""The scheduler's memory check agrees with the simulator's peak memory, for every schedule."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resihp.core import Cluster, Plan, Stage, Workload, build_stage, model_preset
from resihp.core.program import compile_plan
from resihp.core.scenario import Job
from resihp.cost import build_costs
from resihp.evaluator.pipeline import evaluate
from resihp.sched.model import device_memory, fits_memory, plan_memory, usable_bytes

MODELS = ["llama2-7b", "llama2-13b", "qwen2.5-7b", "qwen2.5-14b", "tiny-gqa"]
GPUS = {"a100-40g": 8, "a100-80g": 8, "cpu": 8}


def _split(draw, total: int, parts: int) -> tuple[int, ...]:
    cuts = sorted(draw(st.lists(st.integers(1, total - 1), min_size=parts - 1, max_size=parts - 1,
                                unique=True)))  # fmt: skip
    return tuple(b - a for a, b in zip([0, *cuts], [*cuts, total]))


@st.composite
def jobs_and_plans(draw):
    """Random model, hardware, sequence length, schedule, TP splits (uneven too), layer cuts per
    replica, micro-batch counts; or one common cut with migrated chunks and hollow stages."""
    model = model_preset(draw(st.sampled_from(MODELS)))
    gpu = draw(st.sampled_from(sorted(GPUS)))
    schedule = draw(st.sampled_from(["gpipe", "1f1b", "zbh1"]))
    dp, pp = draw(st.integers(1, 3)), draw(st.integers(1, min(4, model.num_layers)))
    seq = draw(st.sampled_from([1024, 4096, 8192]))
    migrate = dp > 1 and draw(st.booleans())
    m = draw(st.integers(1, 8))
    common = _split(draw, model.num_layers, pp) if pp > 1 else (model.num_layers,)
    device = 0
    replicas = []
    for _ in range(dp):
        layers = common if migrate or pp == 1 else _split(draw, model.num_layers, pp)
        stages, lo = [], 0
        for n in layers:
            tp = draw(st.integers(1, min(4, model.kv_heads * 2, model.heads)))
            speeds = draw(st.lists(st.sampled_from([1.0, 0.7, 0.5, 0.3]), min_size=tp, max_size=tp))
            stages.append(build_stage(model, range(device, device + tp), (lo, lo + n), speeds))
            device, lo = device + tp, lo + n
        replicas.append(tuple(stages))
    micro = tuple(m if migrate else draw(st.integers(1, 8)) for _ in range(dp))
    plan = Plan(model, tuple(replicas), micro, schedule)
    if migrate:
        hollow = {(d, i) for d in range(dp) for i in range(pp) if draw(st.integers(0, 7)) == 0}
        hollow = {h for h in hollow if any((d, h[1]) not in hollow for d in range(dp))}
        moves = []
        for src in range(dp):
            for j in range(m):
                for i in range(pp):
                    live = [d for d in range(dp) if (d, i) not in hollow and d != src]
                    if (src, i) in hollow or (live and draw(st.integers(0, 5)) == 0):
                        moves.append((src, j, i, draw(st.sampled_from(live))))
        replicas = tuple(
            tuple(Stage((), s.layers) if (d, i) in hollow else s for i, s in enumerate(stages))
            for d, stages in enumerate(plan.replicas)
        )
        plan = plan.with_changes(replicas=replicas, assignment=tuple(moves))
    nodes = -(-device // GPUS[gpu])
    job = Job(model, Cluster(nodes, GPUS[gpu], gpu), Workload(seq, m), 1, pp, dp, schedule)
    return job, plan


def _simulated_peak(job, plan) -> dict[int, float]:
    seq = float(job.workload.seq_len)
    g = plan.global_microbatches
    costs = build_costs(job.model, plan, job.cluster, np.full(g, seq), np.full(g, seq * seq))
    return evaluate(compile_plan(plan), costs).peak_memory_bytes


@settings(max_examples=150, deadline=None)
@given(jobs_and_plans())
def test_memory_check_equals_the_simulated_peak(state):
    """Per device, the scheduler's peak bytes are the simulator's; the verdict is the simulator's
    peak against usable HBM; a stage of a plan without migration costs what `device_memory`
    (the planners' per-stage estimate) says, to rounding (it sums the stage's segments at once)."""
    job, plan = state
    peak = _simulated_peak(job, plan)
    assert plan_memory(job, plan) == peak
    assert fits_memory(job, plan) == (max(peak.values()) <= usable_bytes(job))
    if not plan.assignment:
        for d, stages in enumerate(plan.replicas):
            if plan.microbatches[d] != job.workload.num_microbatches:
                continue
            for i, stage in enumerate(stages):
                mem = device_memory(job, stage, i, len(stages), plan.microbatches[d], plan.dp)
                assert mem == pytest.approx({dev: peak[dev] for dev in stage.devices}, rel=1e-12)


def test_zbh1_keeps_p_live_on_every_stage():
    """The issue's case (llama2-13b on A100-40GB, TP 2 / PP 8 / DP 1, 16 micro-batches, layers
    3,4,5,5,5,6,6,6, 7K tokens): ZB-H1 keeps 8 micro-batches live on every stage, so stages 2-7
    exceed usable HBM and the scheduler says so too (it counted p - s before)."""
    model = model_preset("llama2-13b")
    job = Job(model, Cluster(2, 8, "a100-40g"), Workload(7168, 16), 2, 8, 1, "zbh1")
    plan = Plan.uniform(model, 2, 8, 1, 16, "zbh1", layer_split=(3, 4, 5, 5, 5, 6, 6, 6))
    peak = _simulated_peak(job, plan)
    over = sorted(
        {i for i, st_ in enumerate(plan.replicas[0]) for d in st_.devices if peak[d] > usable_bytes(job)}
    )
    assert over == [2, 3, 4, 5, 6, 7]
    assert compile_plan(plan).live_peaks() == {(0, i): 8 for i in range(8)}
    assert not fits_memory(job, plan)
    assert plan_memory(job, plan) == peak
