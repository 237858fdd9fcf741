"""Plan changes at iteration boundaries (torch-free): planned, fail-slow and re-join, and their precedence."""

from resihp.core.faults import FaultSpec
from resihp.core.model_spec import ModelSpec
from resihp.core.plan import Plan
from resihp.runtime.control.boundaries import Boundaries

SPEC = ModelSpec("t", 4, 32, 8, 2, 48, 256)
A, B, C = (Plan.uniform(SPEC, 1, 2, 2, m) for m in (2, 3, 4))


def test_planned_replans_win_and_later_reports_re_decide():
    rejoin = FaultSpec("rejoin", at_iter=5, device=3)
    b = Boundaries([(4, A)], [rejoin], end=8)
    # a fail-slow replan never displaces a planned one due at the same boundary
    assert b.propose(4, B, "resihp: paper", 0).startswith("no replan")
    assert b.at(4, 0, {0, 1, 2, 3}) == (A, "planned", [])
    # a later report, same generation, re-decides the fail-slow replan
    assert b.propose(6, B, "resihp: paper", 1) == "replan at iteration 6: resihp: paper"
    assert b.propose(6, C, "resihp: balance", 1) == "replan at iteration 6: resihp: balance"
    # the re-joining device is reported only while it is not a member
    assert b.at(5, 1, {0, 1, 2}) == (None, "planned", [3])
    assert b.at(5, 1, {0, 1, 2, 3})[2] == []
    assert b.at(6, 1, {0, 1, 2, 3}) == (C, "resihp: balance", [])


def test_stale_and_late_fail_slow_replans_are_dropped():
    b = Boundaries([], [], end=8)
    assert b.propose(3, B, "resihp: paper", 0).startswith("replan at iteration 3")
    assert b.at(3, 1, {0, 1, 2, 3}) == (None, "planned", [])  # decided in generation 0, now 1: stale
    assert b.propose(8, B, "resihp: paper", 1).startswith("no replan")  # the run ends before it
    assert b.at(8, 1, {0}) == (None, "planned", [])
    assert b.propose(5, None, "resihp keeps the current plan", 1) == "resihp keeps the current plan"
    b.add_rejoin(FaultSpec("rejoin", at_iter=6, device=2))
    assert b.at(6, 1, {0, 1}) == (None, "planned", [2])
