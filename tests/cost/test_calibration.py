import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resihp.core import Workload
from resihp.core.costs import Costs
from resihp.cost.calibration import LinearTime, chunk_table, fit_linear_time, fit_linear_times, mape


def _samples(seed, n_const=False, count=400):
    rng = np.random.default_rng(seed)
    wl = Workload(seq_len=8192, num_microbatches=count, lengths="github", seed=seed)
    s = wl.pack(0, count).sum_sq
    n = np.full(count, 8192.0) if n_const else rng.integers(2048, 16384, count).astype(float)
    truth = LinearTime(2e-3, 3e-6, 4e-10)
    t = truth.predict(n, s) * np.exp(0.01 * rng.standard_normal(count))
    return n, s, t, truth


def test_recovers_alpha_beta_within_2_percent():
    """With 1% multiplicative noise the fit recovers c0, alpha and beta to within 2%."""
    n, s, t, truth = _samples(0)
    fit = fit_linear_time(n, s, t)
    assert fit.alpha == pytest.approx(truth.alpha, rel=0.02)
    assert fit.beta == pytest.approx(truth.beta, rel=0.02)
    assert fit.c0 == pytest.approx(truth.c0, rel=0.2)
    assert mape(fit.predict(n, s), truth.predict(n, s)) < 0.5


def test_ignores_five_percent_gross_outliers():
    """5% of samples inflated 2-5x (GC pauses, preemption) leave alpha and beta within 2%."""
    n, s, t, truth = _samples(1)
    rng = np.random.default_rng(9)
    bad = rng.choice(t.size, size=t.size // 20, replace=False)
    t = t.copy()
    t[bad] *= rng.uniform(2.0, 5.0, bad.size)
    fit = fit_linear_time(n, s, t)
    assert fit.alpha == pytest.approx(truth.alpha, rel=0.02)
    assert fit.beta == pytest.approx(truth.beta, rel=0.02)


def test_constant_n_folds_intercept_into_alpha():
    """Packed batches (all N equal) do not crash: c0 = 0 and alpha·N carries the constant."""
    n, s, t, truth = _samples(2, n_const=True)
    fit = fit_linear_time(n, s, t)
    assert fit.c0 == 0.0
    assert fit.alpha * 8192 == pytest.approx(truth.c0 + truth.alpha * 8192, rel=0.02)
    assert fit.beta == pytest.approx(truth.beta, rel=0.02)
    assert mape(fit.predict(n, s), truth.predict(n, s)) < 0.5


def test_no_intercept_and_constant_sum_sq():
    """Forcing c0 = 0 fits alpha, beta exactly; a constant sum_sq gives beta = 0 and an exact fit."""
    n = np.array([1000.0, 2000.0, 3000.0, 4000.0])
    s = np.array([1e5, 4e5, 2e5, 9e5])
    fit = fit_linear_time(n, s, 2e-6 * n + 3e-9 * s, intercept=False)
    assert (fit.c0, fit.alpha, fit.beta) == (0.0, pytest.approx(2e-6), pytest.approx(3e-9))
    s_const = np.full(4, 5e5)
    fit2 = fit_linear_time(n, s_const, 1e-3 + 2e-6 * n + 3e-9 * s_const)
    assert fit2.beta == 0.0
    assert np.allclose(fit2.predict(n, s_const), 1e-3 + 2e-6 * n + 3e-9 * s_const)


def test_predict_is_vectorised_and_keys_fit_separately():
    """predict takes scalars or arrays; fit_linear_times returns one LinearTime per key."""
    lt = LinearTime(1.0, 2.0, 3.0)
    assert lt.predict(1, 1) == 6.0
    assert lt.predict(np.array([1, 2]), np.array([0, 1])).tolist() == [3.0, 8.0]
    rows = [(("s0", "F"), n, n * n, 1e-6 * n + 1e-10 * n * n) for n in (100.0, 300.0, 700.0, 900.0)]
    rows += [(("s0", "B"), n, n * n, 2e-6 * n + 2e-10 * n * n) for n in (100.0, 300.0, 700.0, 900.0)]
    fits = fit_linear_times(rows, intercept=False)
    assert fits[("s0", "B")].alpha == pytest.approx(2 * fits[("s0", "F")].alpha)


def test_bad_input_is_a_value_error():
    """Mismatched lengths, non-positive times and too few samples raise ValueError."""
    with pytest.raises(ValueError):
        fit_linear_time([1, 2], [1], [1, 2])
    with pytest.raises(ValueError):
        fit_linear_time([1, 2, 3], [1, 2, 4], [1, 0, 2])
    with pytest.raises(ValueError):
        fit_linear_time([1, 2], [1, 4], [1, 2])


@settings(max_examples=40, deadline=None)
@given(
    c0=st.floats(1e-5, 1e-2),
    alpha=st.floats(1e-8, 1e-4),
    beta=st.floats(1e-13, 1e-8),
    seed=st.integers(0, 10_000),
)
def test_exact_data_is_reproduced(c0, alpha, beta, seed):
    """Noise-free samples are predicted to 1e-6 relative error, whatever the coefficients."""
    rng = np.random.default_rng(seed)
    n = rng.integers(512, 32768, 30).astype(float)
    s = n**2 * rng.uniform(0.01, 1.0, 30)
    truth = LinearTime(c0, alpha, beta)
    fit = fit_linear_time(n, s, truth.predict(n, s))
    assert np.allclose(fit.predict(n, s), truth.predict(n, s), rtol=1e-6)


def test_fitted_rows_plug_into_the_simulator_costs():
    """chunk_table(F, B, W) is a Costs.chunk entry whose chunk_times equal LinearTime.predict."""
    f, b = LinearTime(1e-3, 2e-6, 3e-10), LinearTime(2e-3, 4e-6, 6e-10)
    tokens, sum_sq = np.array([4096.0, 4096.0]), np.array([1e6, 9e6])
    costs = Costs(tokens, sum_sq, {(0, 0): chunk_table(f, b)})
    idx = np.arange(2)
    assert np.allclose(costs.chunk_times((0, 0), 0, idx), f.predict(tokens, sum_sq))
    assert np.allclose(costs.chunk_times((0, 0), 1, idx), b.predict(tokens, sum_sq))
    assert np.all(costs.chunk_times((0, 0), 2, idx) == 0.0)
