"""Property tests of compile + evaluate over random layouts, migrations and hollow stages."""

from hypothesis import given, settings
from hypothesis import strategies as st

from resihp.core import Plan, Stage, model_preset
from resihp.core.program import compile_plan
from resihp.evaluator.pipeline import evaluate, uniform_costs

MODEL = model_preset("llama2-7b")


@st.composite
def migrated_plans(draw):
    dp = draw(st.integers(2, 4))
    pp = draw(st.integers(1, 4))
    m = draw(st.integers(1, 6))
    schedule = draw(st.sampled_from(["gpipe", "1f1b", "zbh1"]))
    plan = Plan.uniform(MODEL, 1, pp, dp, m, schedule)
    hollow = draw(st.sets(st.tuples(st.integers(0, dp - 1), st.integers(0, pp - 1)), max_size=2))
    # keep at least one live replica per stage
    hollow = {h for h in hollow if any((d, h[1]) not in hollow for d in range(dp))}
    moves = []
    for src in range(dp):
        for j in range(m):
            for i in range(pp):
                live = [d for d in range(dp) if (d, i) not in hollow and d != src]
                if (src, i) in hollow or (live and draw(st.integers(0, 9)) == 0):
                    moves.append((src, j, i, draw(st.sampled_from(live))))
    replicas = tuple(
        tuple(Stage((), s.layers) if (d, i) in hollow else s for i, s in enumerate(stages))
        for d, stages in enumerate(plan.replicas)
    )
    return plan.with_changes(replicas=replicas, assignment=tuple(moves))


@settings(max_examples=200, deadline=None)
@given(plan=migrated_plans())
def test_any_migration_compiles_to_a_deadlock_free_program(plan):
    """Every chunk runs exactly once, in F-before-B-before-W order, and the DAG never deadlocks."""
    program = compile_plan(plan)
    seen = {}
    for g, chunks in program.chunks.items():
        for pos, (kind, src, j) in enumerate(chunks):
            assert plan.executor(src, j, g[1]) == g[0]
            seen[(kind, src, j, g[1])] = pos
    expected = {(k, s, j, i) for s in range(plan.dp) for j in range(plan.microbatches[s])
                for i in range(len(plan.replicas[s])) for k in range(3)}  # fmt: skip
    assert set(seen) == expected
    for kind, src, j, i in expected:
        if kind:
            assert seen[(kind, src, j, i)] > seen[(kind - 1, src, j, i)]
    result = evaluate(program, uniform_costs(plan, p2p=0.1))
    assert result.iteration_s > 0


@settings(max_examples=100, deadline=None)
@given(plan=migrated_plans(), seed=st.integers(0, 2**16))
def test_evaluator_equals_the_oracle_on_any_migration(plan, seed):
    """On migrated plans with hollow stages and random chunk tables, transfer times and blocking
    sends, the evaluator's times equal the chunk-by-chunk oracle's exactly."""
    import numpy as np
    from oracle import oracle_evaluate

    rng = np.random.default_rng(seed)
    costs = uniform_costs(plan)
    costs.sum_sq = rng.uniform(0, 1, plan.global_microbatches)
    costs.send_blocks = bool(seed % 2)
    pairs = {}
    costs.p2p = lambda a, b: pairs.setdefault((a, b), float(rng.uniform(0, 0.2)))
    for g in costs.chunk:
        costs.chunk[g] = rng.uniform(0.1, 2.0, (3, 3))
    program = compile_plan(plan)
    costs.segment_s = {seg.layers: float(rng.uniform(0, 0.5)) for seg in program.segments}
    costs.step_s = 0.05
    got = evaluate(program, costs)
    want = oracle_evaluate(program, costs)
    assert got.iteration_s == want["iteration_s"]
    assert got.group_end_s == want["group_end_s"]
    assert got.live_peak == want["live_peak"]
