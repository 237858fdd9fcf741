import numpy as np
import pytest

from resihp.detect.localize import LocalizeConfig, Localizer
from resihp.detect.report import FailureReport

DEVICES = range(8)
LINKS = [(0, 2), (1, 3), (2, 4), (3, 5), (4, 6), (5, 7)]  # pipeline P2P links, tp = 2, pp = 4


def _iteration(rng, speed=None, link_bw=None, bias=1.0, long_batch=False, wait_on_slow=False):
    """Measured vs predicted times for one iteration of 16 instructions per device and 8 per link."""
    speed, link_bw = speed or {}, link_bw or {}
    base = 0.05 * (1.0 + rng.pareto(1.5, 16))  # heavy-tailed per-micro-batch predicted times
    if long_batch:
        base[3] *= 8.0
    compute, links = {}, {}
    for d in DEVICES:
        noise = np.exp(0.02 * rng.standard_normal(16))
        compute[d] = (base * bias / speed.get(d, 1.0) * noise, base)
    for a, b in LINKS:
        pred = np.full(8, 0.01)
        slow = link_bw.get((a, b), 1.0)
        if wait_on_slow:
            slow = min(slow, speed.get(a, 1.0), speed.get(b, 1.0))
        links[(a, b)] = (pred / slow * np.exp(0.02 * rng.standard_normal(8)), pred)
    return compute, links


def _localize(**kw) -> list[FailureReport]:
    rng = np.random.default_rng(kw.pop("seed", 0))
    loc = Localizer()
    for it in range(2):
        loc.observe(it, *_iteration(rng, **kw))
    return loc.localize()


@pytest.mark.parametrize("p", [0.3, 0.55, 0.8])
def test_slow_device_found_with_severity_within_10_percent(p):
    """A device at speed p is the only report, kind fail-slow, with severity within 10% of p."""
    for seed in range(5):
        reports = _localize(speed={5: p}, seed=seed)
        assert [(r.kind, r.devices) for r in reports] == [("fail-slow", (5,))]
        assert reports[0].severity == pytest.approx(p, rel=0.1)
        assert reports[0].confidence > 0.9


def test_slow_link_is_not_a_slow_device():
    """A link at 40% bandwidth is reported as link-slow (2, 4); no device is blamed."""
    reports = _localize(link_bw={(2, 4): 0.4})
    assert [(r.kind, r.link) for r in reports] == [("link-slow", (2, 4))]
    assert reports[0].severity == pytest.approx(0.4, rel=0.1)


def test_transfers_waiting_on_a_slow_device_blame_the_device():
    """If a slow device also slows its transfers, only the device is reported, not its links."""
    reports = _localize(speed={3: 0.5}, wait_on_slow=True)
    assert [(r.kind, r.devices) for r in reports] == [("fail-slow", (3,))]


def test_long_sequence_batch_and_global_bias_blame_nobody():
    """A long-sequence micro-batch (predicted too) and a 7% global slowdown produce no report."""
    assert _localize(long_batch=True) == []
    assert _localize(bias=1.07) == []


def test_validation_fallback_runs_only_when_nothing_stands_out():
    """The validate hook is called (with the iteration) only when passive localization is empty."""
    calls = []
    fallback = FailureReport("fail-slow", (1,), severity=0.7, confidence=1.0, iteration=1)

    def validate(it):
        calls.append(it)
        return [fallback]

    rng = np.random.default_rng(0)
    loc = Localizer(LocalizeConfig(), validate=validate)
    loc.observe(1, *_iteration(rng))
    assert loc.localize() == [fallback] and calls == [1]
    loc.observe(2, *_iteration(rng, speed={6: 0.5}))
    assert loc.localize()[0].devices == (6,) and calls == [1]


def test_forget_and_bad_input():
    """forget() drops a device's history; mismatched or non-positive timings raise ValueError."""
    rng = np.random.default_rng(0)
    loc = Localizer()
    loc.observe(0, *_iteration(rng, speed={5: 0.5}))
    loc.forget([5])
    assert 5 not in loc.speed_factors() and (3, 5) not in loc.link_factors()
    with pytest.raises(ValueError):
        loc.observe(1, {0: ([1.0, 2.0], [1.0])})
    with pytest.raises(ValueError):
        loc.observe(1, {0: ([0.0], [1.0])})


def test_flat_array_input_matches_mapping_input():
    """observe_arrays (one row per instruction/transfer) gives the same reports as observe."""
    rng = np.random.default_rng(4)
    compute, links = _iteration(rng, speed={2: 0.6}, link_bw={(5, 7): 0.5})
    a, b = Localizer(), Localizer()
    a.observe(0, compute, links)
    dev = np.repeat(list(compute), [len(compute[d][0]) for d in compute])
    pairs = np.repeat(np.array(list(links)), [len(links[k][0]) for k in links], axis=0)
    b.observe_arrays(
        0,
        dev,
        np.concatenate([compute[d][0] for d in compute]),
        np.concatenate([compute[d][1] for d in compute]),
        pairs,
        np.concatenate([links[k][0] for k in links]),
        np.concatenate([links[k][1] for k in links]),
    )
    assert a.localize() == b.localize() and len(a.localize()) == 2
    assert Localizer().localize() == []
