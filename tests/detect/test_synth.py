import numpy as np
import pytest

from resihp.cost.calibration import fit_linear_time, mape
from resihp.detect import GreyhoundDetector, ResiHPDetector
from resihp.detect.synth import SynthConfig, gpipe_iteration_s, synthesize, true_forward_s


def _fit_and_predict(cfg, trace, warmup=20):
    """MTP fits per (stage, F/B) on warm-up chunks; ITP = GPipe DAG on the predicted chunks."""
    n = np.concatenate([x.n for x in trace[:warmup]])
    s = np.concatenate([x.sum_sq for x in trace[:warmup]])
    fits = [
        [fit_linear_time(n, s, np.concatenate([x.chunk_s[st, :, k] for x in trace[:warmup]])) for k in (0, 1)]
        for st in range(cfg.pp)
    ]
    chunk_pred = np.stack(
        [
            np.stack(
                [np.stack([fits[st][k].predict(x.n, x.sum_sq) for k in (0, 1)], -1) for st in range(cfg.pp)]
            )
            for x in trace
        ]
    )
    return chunk_pred, np.array([gpipe_iteration_s(c) for c in chunk_pred])


def test_synth_is_deterministic_and_not_in_the_mtp_form():
    """Same seed, same trace; the noise-free chunk time is not linear in (N, Σl²)."""
    cfg = SynthConfig(seq_len=4096, num_microbatches=4, seed=3)
    a, b = synthesize(cfg, 5), synthesize(cfg, 5)
    assert all(np.array_equal(x.chunk_s, y.chunk_s) and x.observed_s == y.observed_s for x, y in zip(a, b))
    sets = [[4096], [2048, 2048], [3000, 1096], [1024] * 4, [512] * 8, [3500, 500, 96]]
    t = np.array([true_forward_s(cfg, 4096, np.array(x)) for x in sets])
    sq = np.array([float(np.sum(np.square(x))) for x in sets])
    coef, *_ = np.linalg.lstsq(np.stack([np.ones_like(sq), sq], 1), t, rcond=None)
    rel = np.abs(np.stack([np.ones_like(sq), sq], 1) @ coef / t - 1.0)
    assert rel.max() > 1e-3  # at fixed N, time is not affine in Σl²


@pytest.mark.parametrize("lengths,seq_len", [("github", 8192), ("c4", 16384)])
def test_predictors_meet_mape_targets_on_synthetic_traces(lengths, seq_len):
    """Micro-batch MAPE <= 2% and iteration MAPE <= 5% on healthy synthetic iterations."""
    cfg = SynthConfig(seq_len=seq_len, lengths=lengths, seed=1, spike_prob=0.0)
    trace = synthesize(cfg, 80)
    chunk_pred, it_pred = _fit_and_predict(cfg, trace)
    chunk_meas = np.stack([x.chunk_s for x in trace])
    assert mape(chunk_pred[20:], chunk_meas[20:]) <= 2.0
    assert mape(it_pred[20:], [x.observed_s for x in trace[20:]]) <= 5.0


def test_slow_stage_found_by_resihp_within_3_iterations():
    """A stage at speed 0.5 from iteration 120 is alarmed by both ResiHP modes within 3 iterations,
    with no alarm before it."""
    for seed in range(3):
        cfg = SynthConfig(seq_len=8192, seed=seed, slow={1: (120, 0.5)})
        trace = synthesize(cfg, 160)
        _, it_pred = _fit_and_predict(cfg, trace)
        dets = [ResiHPDetector(), ResiHPDetector(mode="normalize"), GreyhoundDetector()]
        for x, p in zip(trace, it_pred):
            for d in dets:
                d.observe(x.iteration, x.observed_s, float(p))
        for d in dets[:2]:
            assert [a.iteration for a in d.alarms if a.iteration < 119] == []
            first = d.alarms[0]
            assert 119 <= first.iteration <= 121 and first.detected_at - 120 <= 3, (seed, first)
