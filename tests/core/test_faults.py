"""The one fault semantics (`core.faults.check_faults`, `timeline`) and the generator arguments."""

import math

import pytest

from resihp.core.faults import FaultSpec, check_faults, timeline
from resihp.core.scenario import generator_args

DEVICES = range(8)


def slow(at, device=1, duration_s=None, severity=0.5, key="at_iter"):
    return FaultSpec("slow", device=device, severity=severity, duration_s=duration_s, **{key: at})


def test_the_checked_list_comes_back_iteration_keyed_first_each_in_time_order():
    """Sorted by domain, then time, then list order (what the runtime's TimedFaults expects)."""
    a = FaultSpec("stop", at_s=2.0, device=0)
    b = FaultSpec("stop", at_iter=5, device=1)
    c = FaultSpec("stop", at_iter=2, device=2)
    d = FaultSpec("stop", at_s=1.0, device=3)
    assert check_faults([a, b, c, d], DEVICES) == (c, b, d, a)


@pytest.mark.parametrize(
    "kwargs, faults, message",
    [
        ({"iterations": 10}, [FaultSpec("stop", at_iter=10, device=0)],
         r"faults\[0\].at_iter = 10: at or after the run's end; allowed: 0 <= at_iter < 10 \(run.iter"),
        ({"iterations": 10, "start": 4}, [FaultSpec("stop", at_iter=3, device=0)],
         r"faults\[0\].at_iter = 3: before the resumed run's start; allowed: 4 <= at_iter < 10"),
        ({"duration_s": 60.0}, [FaultSpec("stop", at_s=60, device=0)],
         r"faults\[0\].at_s = 60: at or after the run's end; allowed: at_s < 60 \(run.duration_s\)"),
        ({"links": False}, [FaultSpec("link", at_iter=1, src=0, dst=1, severity=0.5)],
         r"faults\[0\] \(link at_iter 1\): a link fault has no effect while run.link_mb_per_s = 0"),
    ],
)  # fmt: skip
def test_faults_outside_the_run_or_without_effect_are_rejected(kwargs, faults, message):
    with pytest.raises(ValueError, match=message):
        check_faults(faults, DEVICES, **kwargs)
    check_faults(faults, DEVICES)  # the same list is fine where the run's bounds are unknown


def test_a_stop_ends_the_slow_fault_and_the_device_rejoins_healthy():
    """After stop + rejoin a new slow fault on the device is no overlap, in either domain."""
    for key, t in (("at_iter", (1, 3, 5, 7)), ("at_s", (1.0, 3.0, 5.0, 7.0))):
        faults = [
            slow(t[0], key=key),
            FaultSpec("stop", device=1, **{key: t[1]}),
            FaultSpec("rejoin", device=1, **{key: t[2]}),
            slow(t[3], key=key),
        ]
        assert len(check_faults(faults, DEVICES)) == 4


def test_a_link_fault_outlives_a_stop_of_its_end():
    """Re-joined, the device's link is still slow: a second link fault on it overlaps."""
    faults = [
        FaultSpec("link", at_iter=1, src=0, dst=1, severity=0.5),
        FaultSpec("stop", at_iter=3, device=0),
        FaultSpec("rejoin", at_iter=5, device=0),
        FaultSpec("link", at_iter=7, src=1, dst=0, severity=0.5),
    ]
    with pytest.raises(
        ValueError, match=r"faults\[3\] \(link at_iter 7\): overlaps faults\[0\].*on link \[0, 1\]"
    ):
        check_faults(faults, DEVICES)


def test_an_at_iter_duration_ends_at_an_unknown_iteration():
    """In seconds the end is known: back-to-back is fine; keyed by iteration it is not."""
    assert len(check_faults([slow(0, duration_s=5, key="at_s"), slow(5, key="at_s")], DEVICES)) == 2
    with pytest.raises(ValueError, match="key both by at_s"):
        check_faults([slow(0, duration_s=5), slow(50)], DEVICES)
    with pytest.raises(ValueError, match=r"end one \(duration_s\) before the next starts"):
        check_faults([slow(0, duration_s=5, key="at_s"), slow(4.5, key="at_s")], DEVICES)


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"at_s": math.inf}, "faults.at_s = inf: must be a finite number >= 0"),
        ({"at_s": math.nan}, "faults.at_s = nan: must be a finite number >= 0"),
        ({"at_s": 1.0, "severity": 0.5, "duration_s": math.inf, "kind": "slow"}, "faults.duration_s = inf"),
        ({"at_s": 1.0, "severity": math.nan, "kind": "slow"}, "faults.severity = nan"),
    ],
)
def test_non_finite_times_and_factors_are_rejected(raw, message):
    with pytest.raises(ValueError, match=message):
        FaultSpec.from_dict({"kind": "stop", "device": 0, **raw})


def test_timeline_drops_the_end_of_a_slow_cut_by_a_stop():
    """The slow's scheduled end after the stop is not a change; the re-join comes back healthy."""
    faults = [slow(0, duration_s=10, key="at_s"), FaultSpec("stop", at_s=2, device=1)]
    assert [(c.t_s, c.kind) for c in timeline(faults, 1.0)] == [(0.0, "slow"), (2.0, "stop")]


@pytest.mark.parametrize("value", [0, -5, math.inf])
def test_generator_limits_are_worded_once(value):
    """interval_s 0 and -5 (and inf) break one rule with one wording."""
    with pytest.raises(ValueError, match=rf"faults.interval_s = {value}: must be a number > 0"):
        generator_args({"generator": "stop-every", "interval_s": value})


def test_generator_defaults_are_filled_in():
    name, args = generator_args({"generator": "mixed", "interval_s": 60})
    assert name == "mixed" and args == {
        "interval_s": 60,
        "level": "M",
        "start_s": 300.0,
        "rejoin_after_s": 0.0,
    }
    with pytest.raises(ValueError, match=r"faults.max_fraction = 1: must be a number in \(0, 1\)"):
        generator_args({"generator": "stop-every", "interval_s": 60, "max_fraction": 1})
