import math

import numpy as np
import pytest

from resihp.detect.bocpd import BOCPD


def test_finds_30_percent_step_within_a_few_points():
    """A 30% step in 3%-noisy log data crosses P(change) > 0.9 within 3 points, dated exactly."""
    for seed in range(10):
        rng = np.random.default_rng(seed)
        x = np.log(np.r_[np.ones(150), 1.3 * np.ones(20)] * np.exp(0.03 * rng.standard_normal(170)))
        b = BOCPD()
        hits = [t for t in range(170) if b.update(x[t]) > 0.9 and t > 10]
        assert hits and 150 <= hits[0] <= 152, (seed, hits[:3])
        b2 = BOCPD()
        for t in range(hits[0] + 1):
            b2.update(x[t])
        assert b2.change_index() == 150


def test_quiet_on_stationary_noise():
    """Stationary lognormal noise (1%..10%) never crosses 0.9 after a 10-point warm-up."""
    for sigma in (0.01, 0.03, 0.1):
        for seed in range(10):
            rng = np.random.default_rng(seed)
            b = BOCPD()
            probs = [b.update(v) for v in sigma * rng.standard_normal(400)]
            assert max(probs[10:]) < 0.9, (sigma, seed)


def test_posterior_is_normalised_and_truncated():
    """The run-length posterior sums to 1, P(r_t = 0) equals the hazard, and its length <= max_run."""
    b = BOCPD(hazard=0.01, max_run=50)
    rng = np.random.default_rng(0)
    for v in rng.standard_normal(200):
        b.update(v)
    post = b.run_length_posterior()
    assert post.size == 50
    assert post.sum() == pytest.approx(1.0)
    assert post[0] == pytest.approx(0.01)
    assert b.map_run_length == 49  # the ">= max_run" bin holds the long run


def test_snapshot_restore_replays_identically():
    """restore(state()) then the same updates gives the same posterior (snapshots are immutable)."""
    b = BOCPD()
    for v in (1.0, 1.1, 0.9, 1.0):
        b.update(v)
    snap = b.state()
    for v in (5.0, 5.1):
        b.update(v)
    after = b.run_length_posterior().copy()
    b.restore(snap)
    assert b.t == 4
    for v in (5.0, 5.1):
        b.update(v)
    assert np.array_equal(b.run_length_posterior(), after)


def test_bad_parameters_and_values_raise():
    """Out-of-range hazard/priors and non-finite observations raise ValueError."""
    with pytest.raises(ValueError):
        BOCPD(hazard=0.0)
    with pytest.raises(ValueError):
        BOCPD(beta0=0.0)
    with pytest.raises(ValueError):
        BOCPD().update(math.nan)
