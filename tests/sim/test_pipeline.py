"""The DAG simulator against closed forms: bubbles, activation stashes, bottlenecks, migration."""

import json

import pytest

from resihp.core import Plan, model_preset
from resihp.core.program import B, F, W, compile_plan
from resihp.evaluator.pipeline import evaluate, uniform_costs, write_trace

MODEL = model_preset("llama2-7b")


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (8, 32), (6, 3)])
def test_bubble_fraction_matches_closed_form(schedule, p, m):
    """With uniform costs and free communication the bubble is (p-1)/(m+p-1) for GPipe and 1F1B."""
    plan = Plan.uniform(MODEL, 1, p, 1, m, schedule)
    result = evaluate(compile_plan(plan), uniform_costs(plan))
    assert result.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)


@pytest.mark.parametrize("p,m", [(4, 8), (4, 16), (8, 32), (8, 64)])
def test_zbh1_bubble_is_a_third_of_1f1b(p, m):
    """ZB-H1 with F = B = W idles (p-1)(F+B-W): a third of 1F1B's (p-1)(F+B+W)."""
    times = {}
    for schedule in ("1f1b", "zbh1"):
        plan = Plan.uniform(MODEL, 1, p, 1, m, schedule)
        times[schedule] = evaluate(compile_plan(plan), uniform_costs(plan)).iteration_s
    assert times["1f1b"] - 3 * m == pytest.approx(3 * (p - 1))
    assert times["zbh1"] - 3 * m == pytest.approx(p - 1)


@pytest.mark.parametrize("schedule", ["1f1b", "zbh1"])
@pytest.mark.parametrize("p,m", [(4, 8), (4, 2), (8, 5), (3, 3)])
def test_live_activations_per_stage(schedule, p, m):
    """1F1B keeps min(p-s, m) micro-batches live on stage s; ZB-H1 never more than min(p, m)."""
    plan = Plan.uniform(MODEL, 1, p, 1, m, schedule)
    result = evaluate(compile_plan(plan), uniform_costs(plan))
    for s in range(p):
        live = result.live_peak[(0, s)]
        if schedule == "1f1b":
            assert live == min(p - s, m)
        else:
            assert min(p - s, m) <= live <= min(p, m)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "zbh1"])
@pytest.mark.parametrize("p,slow,speed", [(4, 1, 0.5), (8, 7, 0.4), (4, 0, 0.3), (4, 2, 0.7)])
def test_slow_stage_sets_steady_state_rate(schedule, p, slow, speed):
    """A stage at speed p adds exactly its own (F+B+W)/p per extra micro-batch: the bottleneck."""
    times = []
    for m in (16, 17, 24):
        plan = Plan.uniform(MODEL, 1, p, 1, m, schedule)
        costs = uniform_costs(plan, f=1.0, b=1.5, w=0.7)
        costs.chunk[(0, slow)] = costs.chunk[(0, slow)] / speed
        times.append(evaluate(compile_plan(plan), costs).iteration_s)
    assert times[1] - times[0] == pytest.approx(3.2 / speed)
    assert (times[2] - times[0]) / 8 == pytest.approx(3.2 / speed)


def test_dp_replicas_wait_for_the_slowest():
    """Gradient sync makes every replica finish when the slowest one does (DP amplification)."""
    plan = Plan.uniform(MODEL, 2, 2, 2, 4)
    costs = uniform_costs(plan)
    costs.chunk[(1, 1)] = costs.chunk[(1, 1)] * 2
    result = evaluate(compile_plan(plan), costs)
    ends = result.group_end_s
    assert ends[(0, 0)] == ends[(1, 0)] and ends[(0, 1)] == ends[(1, 1)]
    healthy = evaluate(compile_plan(plan), uniform_costs(plan)).iteration_s
    assert result.iteration_s > healthy
    assert result.idle_s[0] > result.idle_s[6]  # replica 0 idles behind replica 1


def test_migrated_microbatch_runs_once_and_crosses_replicas():
    """A migrated chunk runs exactly once, on the other replica, with P2P edges across replicas."""
    base = Plan.uniform(MODEL, 1, 3, 2, 4)
    plan = base.with_changes(assignment=((0, 2, 1, 1),))  # stage 1 of replica 0's micro-batch 2
    program = compile_plan(plan)
    runs = [
        (g, kind) for g, chunks in program.chunks.items() for kind, src, j in chunks
        if (src, j) == (0, 2) and g[1] == 1
    ]  # fmt: skip
    assert sorted(runs) == [((1, 1), F), ((1, 1), B), ((1, 1), W)]
    dev = plan.replicas[1][1].devices[0]
    instrs = [x for x in program.instructions(dev) if (x.src, x.mb) == (0, 2)]
    assert [(x.op, x.what, x.peer) for x in instrs] == [
        ("RECV", "act", (0, 0)), ("F", "", None), ("SEND", "act", (0, 2)),
        ("RECV", "grad", (0, 2)), ("B", "", None), ("W", "", None), ("SEND", "grad", (0, 0)),
    ]  # fmt: skip
    # Every (source replica, micro-batch, stage) appears exactly once per kind over all groups.
    seen = [(src, j, g[1], kind) for g, ch in program.chunks.items() for kind, src, j in ch]
    assert len(seen) == len(set(seen)) == 3 * 2 * 4 * 3
    healthy = evaluate(compile_plan(base), uniform_costs(base)).iteration_s
    moved = evaluate(program, uniform_costs(plan)).iteration_s
    assert moved > healthy  # replica 1's stage 1 now does 5 micro-batches


def test_hollow_stage_work_runs_on_peers():
    """A hollow (dead) stage's micro-batches all run on same-stage peers and nothing deadlocks."""
    base = Plan.uniform(MODEL, 1, 2, 3, 4)
    stages = list(base.replicas[0])
    stages[1] = stages[1].__class__((), stages[1].layers)
    moves = tuple((0, j, 1, 1 + j % 2) for j in range(4))
    plan = base.with_changes(replicas=(tuple(stages), *base.replicas[1:]), assignment=moves)
    program = compile_plan(plan)
    assert (0, 1) not in program.chunks
    assert sum(1 for k, s, _ in program.chunks[(1, 1)] if k == F and s == 0) == 2
    result = evaluate(program, uniform_costs(plan))
    assert result.iteration_s > evaluate(compile_plan(base), uniform_costs(base)).iteration_s


def test_chrome_trace(tmp_path):
    """The trace holds one complete event per chunk with non-negative times, loadable as JSON."""
    plan = Plan.uniform(MODEL, 1, 2, 1, 3, "zbh1")
    program = compile_plan(plan)
    result = evaluate(program, uniform_costs(plan, p2p=0.1), keep_spans=True)
    path = tmp_path / "trace.json"
    write_trace(program, result, str(path))
    events = json.loads(path.read_text())["traceEvents"]
    chunks = [e for e in events if e["ph"] == "X"]
    assert len(chunks) == 2 * 3 * 3
    assert all(e["ts"] >= 0 and e["dur"] > 0 for e in chunks)
    assert {e["cat"] for e in chunks} == {"F", "B", "W"}


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "zbh1"])
def test_evaluator_equals_the_chunk_by_chunk_oracle(schedule):
    """The level-vectorised pass over tiled replicas gives the scalar oracle's times exactly
    (blocking sends, per-pair transfer times, uneven chunk tables, a sync time per segment)."""
    import numpy as np
    from oracle import oracle_evaluate

    plan = Plan.uniform(MODEL, 2, 4, 6, 7, schedule)
    costs = uniform_costs(plan, p2p=0.05)
    rng = np.random.default_rng(0)
    costs.sum_sq = rng.uniform(0, 1, plan.global_microbatches)
    costs.send_blocks = True
    costs.p2p = lambda a, b: 0.01 * (1 + a[0] + 2 * b[1])
    for g in costs.chunk:
        costs.chunk[g] = costs.chunk[g] * rng.uniform(0.5, 1.5) + np.array([[0, 0, 0.3]] * 3)
    program = compile_plan(plan)
    costs.segment_s = {seg.layers: 0.1 * k for k, seg in enumerate(program.segments)}
    got = evaluate(program, costs)
    want = oracle_evaluate(program, costs)
    assert got.iteration_s == want["iteration_s"]
    assert got.group_end_s == want["group_end_s"]
    assert got.live_peak == want["live_peak"]
    busy = {dev: want["busy_s"][g] for g in program.chunks for dev in program.devices(g)}
    assert got.busy_s == pytest.approx(busy, rel=1e-12)
    spans = evaluate(program, costs, keep_spans=True).spans
    assert {(k, s, j, g[1]): t1 for g, sp in spans.items() for k, s, j, _, t1 in sp} == want["end"]


@pytest.mark.parametrize("schedule", ["1f1b", "zbh1"])
def test_shared_pipeline_structure_serves_other_replicas_exactly(schedule):
    """A template pipeline's structure is built once per (schedule, micro-batches, stages) and
    reused by later plans of that shape whatever their replicas (evaluator.dag._SHAPES): a plan whose
    replicas 1, 2, 4, 5 take the shape an earlier plan built on replica 0 still gives the scalar
    oracle's times exactly, next to replicas of other shapes."""
    import numpy as np
    from oracle import oracle_evaluate

    from resihp.core.program import forget_compiled
    from resihp.evaluator import dag

    first = Plan.uniform(MODEL, 2, 4, 6, 7, schedule)
    forget_compiled()  # no Program (nor the structure cached on it) from an earlier test
    dag._SHAPES.clear()
    evaluate(compile_plan(first), uniform_costs(first))
    assert set(dag._SHAPES) == {(schedule, 7, 4)}
    plan = first.with_changes(microbatches=(5, 7, 7, 9, 7, 7))
    costs = uniform_costs(plan, p2p=0.05)
    rng = np.random.default_rng(1)
    costs.sum_sq = rng.uniform(0, 1, plan.global_microbatches)
    costs.send_blocks = True
    costs.p2p = lambda a, b: 0.01 * (1 + a[0] + 2 * b[1])
    for g in costs.chunk:
        costs.chunk[g] = costs.chunk[g] * rng.uniform(0.5, 1.5) + np.array([[0, 0, 0.3]] * 3)
    program = compile_plan(plan)
    costs.segment_s = {seg.layers: 0.1 * k for k, seg in enumerate(program.segments)}
    got = evaluate(program, costs, keep_spans=True)
    assert set(dag._SHAPES) == {(schedule, n, 4) for n in (5, 7, 9)}
    want = oracle_evaluate(program, costs)
    assert got.iteration_s == want["iteration_s"]
    assert got.group_end_s == want["group_end_s"]
    assert got.live_peak == want["live_peak"]
    assert {(k, s, j, g[1]): t1 for g, sp in got.spans.items() for k, s, j, _, t1 in sp} == want["end"]
