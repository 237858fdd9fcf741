import importlib.util
from pathlib import Path

import numpy as np
import pytest

from resihp.core.model_spec import model_preset
from resihp.core.plan import Plan
from resihp.cost.calibration import LinearTime
from resihp.detect.itp import ITP, BatchDag


def _oracle():
    """tests/sim/oracle.py (the chunk-by-chunk evaluation), loaded by path."""
    path = Path(__file__).resolve().parents[1] / "sim" / "oracle.py"
    spec = importlib.util.spec_from_file_location("sim_oracle", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.oracle_evaluate


def _itp(schedule, pp, m, p2p=0.0):
    plan = Plan.uniform(model_preset("llama2-13b"), 1, pp, 1, m, schedule)
    rng = np.random.default_rng(pp)
    fits = {}
    for i in range(pp):
        for k, scale in (("F", 1.0), ("B", 1.6), ("W", 0.5)):
            fits[((0, i), k)] = LinearTime(1e-3 * scale, 2e-6 * scale * rng.uniform(0.8, 1.2), 1e-11 * scale)
    return ITP(plan, fits, p2p=p2p, step_s=0.01)


@pytest.mark.parametrize("schedule,pp,m", [("1f1b", 4, 8), ("zbh1", 4, 8), ("gpipe", 2, 4)])
def test_batch_dag_equals_the_pipeline_simulator(schedule, pp, m):
    """BatchDag on the ITP's linear chunk times reproduces the chunk-by-chunk oracle (and the ITP's
    own prediction) for every iteration of a batch."""
    itp = _itp(schedule, pp, m, p2p=0.004)
    dag = BatchDag(itp.program)
    rng = np.random.default_rng(0)
    tokens = np.full((5, m), 8192.0)
    sum_sq = rng.uniform(1e6, 6e7, (5, m))
    oracle = _oracle()
    want = [oracle(itp.program, itp.costs(tokens[b], sum_sq[b]))["iteration_s"] for b in range(5)]
    assert want == [itp.predict(tokens[b], sum_sq[b]) for b in range(5)]
    dur, edge, send = {}, {}, {}
    for g in dag.groups:
        rows = itp.table[g][dag.kind[g]]  # (chunks, 3)
        dur[g] = rows[:, 0] + rows[:, 1] * tokens[:, dag.mb[g]] + rows[:, 2] * sum_sq[:, dag.mb[g]]
        edge[g] = np.broadcast_to(np.where(dag.in_xfer[g] >= 0, 0.004, 0.0), dur[g].shape)
        send[g] = np.broadcast_to(np.where(dag.out_xfer[g] >= 0, 0.004, 0.0), dur[g].shape)
    got = dag.iteration_s(dur, edge, send, tail_s=0.01)
    assert np.allclose(got, want, rtol=1e-12)


def test_itp_refits_after_a_plan_change():
    """After a Plan change the ITP is rebuilt from samples of the new layout; missing rows are an error."""
    itp = _itp("1f1b", 2, 4)
    new = Plan.uniform(model_preset("llama2-13b"), 1, 4, 1, 4, "1f1b")
    sq = (1e6, 2e6, 4e6)
    samples = [((0, i), k, 8192.0, s, 0.1 + 1e-9 * s) for i in range(4) for k in "FB" for s in sq]
    fresh = itp.refit(new, samples)
    assert fresh.program.plan is new and fresh.predict(np.full(4, 8192.0), np.full(4, 2e6)) > 0
    with pytest.raises(ValueError, match="no fitted"):
        ITP(new, {})


def test_seam_on_a_gpipe_program_matches_the_synthesizer_default():
    """The synthesizer seam built on a compiled GPipe Program equals synth's own GPipe DAG."""
    from resihp.detect.itp import iteration_time_seam
    from resihp.detect.synth import gpipe_iteration_s

    seam = iteration_time_seam(Plan.uniform(model_preset("llama2-13b"), 1, 4, 1, 6, "gpipe"))
    chunk = np.random.default_rng(1).uniform(0.5, 2.0, (4, 6, 2))
    assert seam(chunk) == pytest.approx(gpipe_iteration_s(chunk), rel=1e-12)
