"""Contradictory fault traces: clear errors or the documented semantics of resihp.sim.trace."""

import pytest

from resihp.core.cluster import Cluster
from resihp.core.faults import FaultSpec
from resihp.sim.trace import build_trace

CLUSTER = Cluster(2, 8)


def trace(*faults):
    return build_trace(tuple(faults), CLUSTER, 1.0)


def test_stop_of_a_dead_device_is_an_error():
    """Stopping a device twice names the fault and the device."""
    with pytest.raises(ValueError, match="device 3 is already dead"):
        trace(FaultSpec("stop", at_s=1, device=3), FaultSpec("stop", at_s=2, device=3))


def test_rejoin_of_a_live_device_is_an_error():
    """Only a stopped device can re-join."""
    with pytest.raises(ValueError, match="device 4 is alive"):
        trace(FaultSpec("rejoin", at_s=5, device=4))


def test_overlapping_slows_on_one_device_are_an_error():
    """Two slow faults overlapping on one device are rejected; back-to-back ones are fine."""
    with pytest.raises(ValueError, match="overlaps faults"):
        trace(
            FaultSpec("slow", at_s=0, device=1, severity=0.5),
            FaultSpec("slow", at_s=5, device=1, severity=0.3),
        )
    ok = trace(
        FaultSpec("slow", at_s=0, device=1, severity=0.5, duration_s=5),
        FaultSpec("slow", at_s=5, device=1, severity=0.3),
    )
    assert [e.kind for e in ok] == ["slow", "slow-end", "slow"]
    flipped = trace(
        FaultSpec("slow", at_s=5, device=1, severity=0.3),
        FaultSpec("slow", at_s=0, device=1, severity=0.5, duration_s=5),
    )
    assert flipped == ok  # at one time an end comes before an onset, whatever the list order


def test_at_iter_faults_land_at_multiples_of_the_iteration_time():
    """`at_iter = k` is the change at k · t0, its duration counted from there, in seconds."""
    events = build_trace(
        (
            FaultSpec("slow", at_iter=3, device=1, severity=0.5, duration_s=2),
            FaultSpec("stop", at_iter=4, device=2),
        ),
        CLUSTER,
        1.5,
    )
    assert [(e.t_s, e.kind) for e in events] == [(4.5, "slow"), (6.0, "stop"), (6.5, "slow-end")]


def test_each_change_reports_as_a_perfect_detector_would():
    """The one fault -> report mapping: kinds, devices or link, severities."""
    events = trace(
        FaultSpec("slow", at_s=0, device=1, severity=0.5, duration_s=5),
        FaultSpec("link", at_s=1, src=3, dst=2, severity=0.25, duration_s=5),
        FaultSpec("stop", at_s=2, device=4),
        FaultSpec("rejoin", at_s=3, device=4),
    )
    got = [(r.kind, r.devices, r.link, r.severity) for r in (e.report() for e in events)]
    assert got == [
        ("fail-slow", (1,), None, 0.5),
        ("link-slow", (), (2, 3), 0.25),
        ("fail-stop", (4,), None, 0.0),
        ("rejoin", (4,), None, 1.0),
        ("recovered", (1,), None, 1.0),
        ("recovered", (), (2, 3), 1.0),
    ]


def test_slow_or_link_fault_on_a_dead_device_is_an_error():
    """A fail-slow needs a live device; a slow link needs both ends alive."""
    with pytest.raises(ValueError, match="is dead"):
        trace(FaultSpec("stop", at_s=0, device=2), FaultSpec("slow", at_s=1, device=2, severity=0.5))
    with pytest.raises(ValueError, match=r"faults\[1\] \(link at_s 1\): device 2 is dead \(faults\[0\]"):
        trace(FaultSpec("stop", at_s=0, device=2), FaultSpec("link", at_s=1, src=2, dst=9, severity=0.5))


def test_stop_during_a_slow_ends_the_slow():
    """A device that stops while slow drops its scheduled slow-end and re-joins healthy."""
    events = trace(
        FaultSpec("slow", at_s=0, device=1, severity=0.5, duration_s=100),
        FaultSpec("stop", at_s=10, device=1),
        FaultSpec("rejoin", at_s=20, device=1),
    )
    assert [e.kind for e in events] == ["slow", "stop", "rejoin"]
    cluster = CLUSTER
    for e in events:
        cluster = e.apply(cluster)
    assert cluster.alive[1] and cluster.speed[1] == 1.0


def test_device_out_of_range_is_an_error():
    """A fault naming a device the cluster lacks is rejected with the allowed range."""
    with pytest.raises(ValueError, match=r"allowed: 0\.\.15"):
        trace(FaultSpec("stop", at_s=0, device=16))
