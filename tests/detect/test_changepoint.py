import numpy as np
import pytest

from resihp.detect.changepoint import (
    ChangePointStage,
    DetectorConfig,
    GreyhoundDetector,
    ResiHPDetector,
)


def _length_jitter(seed: int, iters: int = 300) -> tuple[np.ndarray, np.ndarray]:
    """Predicted healthy times with heavy-tailed bursts of long documents, and observed times."""
    rng = np.random.default_rng(seed)
    pred = np.ones(iters)
    i = 0
    while i < iters:
        if rng.random() < 0.06:
            k = int(rng.integers(2, 7))
            pred[i : i + k] *= 1.1 + 0.3 * rng.pareto(2.0)
            i += k
        else:
            i += 1
    return pred, pred * np.exp(0.02 * rng.standard_normal(iters))


def _run(detectors, pred, obs):
    for t in range(pred.size):
        for d in detectors:
            d.observe(t, float(obs[t]), float(pred[t]))


def test_greyhound_alarms_on_length_jitter_resihp_filters_it():
    """Sequence-length bursts make Greyhound alarm repeatedly; the ResiHP filter drops every one."""
    total_g = 0
    for seed in range(5):
        pred, obs = _length_jitter(seed)
        g, r, n = GreyhoundDetector(), ResiHPDetector(), ResiHPDetector(mode="normalize")
        _run((g, r, n), pred, obs)
        total_g += len(g.alarms)
        assert r.alarms == [] and n.alarms == [], seed
        assert r.benign  # the bursts were removed from the series
    assert total_g >= 10


def test_true_fail_slow_detected_within_3_iterations():
    """A persistent 1/0.6 slowdown from iteration 200 is alarmed by all detectors within 3 iterations."""
    for seed in range(5):
        pred, obs = _length_jitter(seed)
        obs[200:] /= 0.6
        g, r, n = GreyhoundDetector(), ResiHPDetector(), ResiHPDetector(mode="normalize")
        _run((g, r, n), pred, obs)
        for d in (r, n):
            assert [a for a in d.alarms if a.iteration < 199] == [], seed
        for d in (g, r, n):
            first = next(a for a in d.alarms if a.iteration >= 199)
            assert abs(first.iteration - 200) <= 1 and first.detected_at - 200 <= 3, (seed, first)
            assert first.shift > 0.3


def test_single_spike_is_rejected_by_mean_shift_check():
    """One 3x spike in 2% noise yields no Detection: the robust after-window mean has not moved."""
    rng = np.random.default_rng(0)
    x = np.exp(0.02 * rng.standard_normal(100))
    x[60] *= 3.0
    g = GreyhoundDetector()
    for t in range(100):
        g.observe(t, float(x[t]))
    assert g.detections == [] and g.alarms == []


def test_removed_points_are_as_if_never_seen():
    """After remove(), the BOCPD posterior equals that of a stage that never saw those points."""
    cfg = DetectorConfig()
    rng = np.random.default_rng(3)
    x = np.exp(0.02 * rng.standard_normal(50))
    x[40:43] *= 1.5
    a, b = ChangePointStage(cfg), ChangePointStage(cfg)
    for t in range(50):
        a.push(t, float(x[t]))
        if t not in (40, 41, 42):
            b.push(t, float(x[t]))
    a.remove([40, 41, 42])
    assert [p[0] for p in a.points()] == [p[0] for p in b.points()]
    assert np.allclose(a._bocpd.run_length_posterior(), b._bocpd.run_length_posterior())


def test_thresholds_change_at_run_time():
    """reconfigure(gate=1.0) turns a 1.67x slowdown into a benign point instead of an alarm."""
    pred = np.ones(120)
    obs = pred * np.exp(0.02 * np.random.default_rng(1).standard_normal(120))
    obs[100:] /= 0.6
    r = ResiHPDetector()
    r.reconfigure(gate=1.0)
    _run((r,), pred, obs)
    assert r.alarms == [] and r.benign
    assert r.config.gate == 1.0


def test_bad_config_names_the_key():
    """An invalid threshold or unknown key raises ValueError naming it; so does an unknown mode."""
    with pytest.raises(ValueError, match="detector.threshold"):
        DetectorConfig(threshold=1.5)
    with pytest.raises(ValueError, match="detector.persistance"):
        DetectorConfig.from_dict({"persistance": 3})
    with pytest.raises(ValueError, match="detector.mode"):
        ResiHPDetector(mode="bogus")
