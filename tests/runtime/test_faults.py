"""Faults files for the runtime: parsing, validation before any process starts, per-iteration state,
the controller's resolution of time to iterations; one run with time-keyed faults."""

import dataclasses

import pytest

from resihp.core.faults import FaultSpec, check_faults
from resihp.core.model_spec import ModelSpec
from resihp.core.plan import Plan
from resihp.runtime.config import TrainConfig
from resihp.runtime.control.pids import alive
from resihp.runtime.faults import FaultEnd, TimedFaults, faults_at, join_stop, load_faults
from resihp.runtime.reference import reference_for
from resihp.runtime.train import run_training


def _write(tmp_path, text: str) -> str:
    path = tmp_path / "faults.toml"
    path.write_text(text)
    return str(path)


def test_load_and_query_faults(tmp_path):
    """A file's faults are applied from their iteration on; stop only at its iteration; links both ways."""
    path = _write(
        tmp_path,
        "[[faults]]\nkind='slow'\ndevice=1\nat_iter=2\nseverity=0.25\n"
        "[[faults]]\nkind='link'\nsrc=0\ndst=3\nat_iter=1\nseverity=0.5\n"
        "[[faults]]\nkind='stop'\ndevice=2\nat_iter=4\n",
    )
    faults = check_faults(load_faults(path), range(4))
    assert [f.at_iter for f in faults] == [1, 2, 4]
    assert faults_at(faults, 1, 1) == (None, 1.0, {})
    assert faults_at(faults, 1, 5) == (None, 0.25, {})
    assert faults_at(faults, 3, 1) == (None, 1.0, {0: 0.5})
    assert faults_at(faults, 0, 9) == (None, 1.0, {3: 0.5})
    assert faults_at(faults, 2, 4)[0].kind == "stop" and faults_at(faults, 2, 5)[0] is None
    back = check_faults([*faults, FaultSpec("rejoin", at_iter=6, device=2)], range(4))
    assert back[-1].kind == "rejoin" and faults_at(back, 2, 6) == (None, 1.0, {})


@pytest.mark.parametrize(
    "faults, message",
    [
        ([FaultSpec("stop", at_iter=1, device=9)], r"faults\[0\].device = 9: no such device; allowed: 0..3"),
        ([FaultSpec("link", at_iter=1, src=0, dst=8, severity=0.5)], r"faults\[0\].dst = 8: no such device"),
        (
            [FaultSpec("stop", at_iter=1, device=1), FaultSpec("slow", at_iter=1, device=1, severity=0.5)],
            r"device 1 already has faults\[0\] \(stop at_iter 1\) at that time",
        ),
        (
            [FaultSpec("stop", at_iter=1, device=1), FaultSpec("slow", at_iter=3, device=1, severity=0.5)],
            r"faults\[1\] \(slow at_iter 3\): device 1 is dead \(faults\[0\] \(stop at_iter 1\)\)",
        ),
        ([FaultSpec("rejoin", at_iter=1, device=1)], r"faults\[0\] \(rejoin at_iter 1\): device 1 is alive"),
        ([FaultSpec("stop", at_iter=2, device=1), FaultSpec("rejoin", at_iter=2, device=1)], "at that time"),
        (
            [FaultSpec("stop", at_iter=1, device=1), FaultSpec("rejoin", at_s=3.0, device=1)],
            r"faults\[1\] \(rejoin at_s 3\): device 1 also has faults\[0\] \(stop at_iter 1\); key all",
        ),
        (
            [FaultSpec("stop", at_s=1, device=0), FaultSpec("link", at_iter=2, src=1, dst=0, severity=0.5)],
            r"device 0 also has faults\[0\] \(stop at_s 1\)",
        ),
        ([FaultSpec("stop", at_s=1.0, device=9)], r"faults\[0\].device = 9: no such device"),
        (
            [
                FaultSpec("link", at_s=2, src=0, dst=1, severity=0.5),
                FaultSpec("link", at_s=2, src=1, dst=0, severity=0.2),
            ],
            r"faults\[1\] \(link at_s 2\): link \[0, 1\] already has faults\[0\] \(link at_s 2\)",
        ),
        (
            [FaultSpec("stop", at_s=1.5, device=1), FaultSpec("slow", at_s=3, device=1, severity=0.5)],
            r"faults\[1\] \(slow at_s 3\): device 1 is dead \(faults\[0\] \(stop at_s 1.5\)\)",
        ),
        ([FaultSpec("rejoin", at_s=2.0, device=1)], r"faults\[0\] \(rejoin at_s 2\): device 1 is alive"),
        ([FaultSpec("stop", at_s=2.0, device=1), FaultSpec("rejoin", at_s=2.0, device=1)], "at that time"),
        (
            [
                FaultSpec("slow", at_iter=1, device=0, severity=0.5),
                FaultSpec("slow", at_iter=3, device=0, severity=0.2),
            ],
            r"faults\[1\] \(slow at_iter 3\): overlaps faults\[0\] \(slow at_iter 1\) on device 0",
        ),
    ],
)
def test_bad_faults_are_rejected(faults, message):
    with pytest.raises(ValueError, match=message):
        check_faults(faults, range(4))


def test_run_training_rejects_a_bad_faults_file_before_starting(tmp_path):
    """A fault naming a device outside the plan fails in run_training before any process starts."""
    path = _write(tmp_path, "[[faults]]\nkind='stop'\ndevice=12\nat_iter=1\n")
    with pytest.raises(ValueError, match=r"faults\[0\].device = 12: no such device"):
        run_training(TrainConfig(seq_len=32, iterations=2, faults=path), progress=False)
    with pytest.raises(ValueError, match="unknown key"):
        run_training(TrainConfig(faults=_write(tmp_path, "[other]\nx=1\n")), progress=False)
    with pytest.raises(ValueError, match="run.faults"):
        TrainConfig(faults=3)


def test_time_keyed_faults_are_validated_apart_from_iteration_keyed_ones():
    """Each domain sorted by its own key; a duration is accepted on slow and link faults."""
    faults = [
        FaultSpec("rejoin", at_s=3.0, device=1),
        FaultSpec("stop", at_s=1.0, device=1),
        FaultSpec("slow", at_iter=2, device=0, severity=0.5, duration_s=1.5),
    ]
    assert [(f.kind, f.at_iter, f.at_s) for f in check_faults(faults, range(4))] == [
        ("slow", 2, None),
        ("stop", None, 1.0),
        ("rejoin", None, 3.0),
    ]
    with pytest.raises(ValueError, match="duration_s apply only to slow and link"):
        FaultSpec("stop", at_s=1.0, device=1, duration_s=2.0)


def test_time_keyed_faults_resolve_at_the_next_commit_one_per_device():
    """A due fault lands on the iteration after the commit that passed its time; a device's second
    due fault (its rejoin) waits for the next commit; nothing lands past the last iteration."""
    stop, back = FaultSpec("stop", at_s=0.5, device=1), FaultSpec("rejoin", at_s=0.7, device=1)
    link = FaultSpec("link", at_s=0.6, src=2, dst=3, severity=0.5)
    timed = TimedFaults(check_faults([stop, back, link], range(4)), start=0, end=6)
    assert timed.resolve(0, 0.4) == []
    assert timed.resolve(1, 0.8) == [
        dataclasses.replace(stop, at_s=None, at_iter=2),
        FaultSpec("link", at_iter=2, src=2, dst=3, severity=0.5),
    ]
    assert timed.resolve(2, 0.9) == [FaultSpec("rejoin", at_iter=3, device=1)]
    assert [(f.kind, at, t) for f, at, t in timed.injected] == [
        ("stop", 2, 0.8),
        ("link", 2, 0.8),
        ("rejoin", 3, 0.9),
    ]
    assert faults_at(timed.faults, 1, 2)[0].kind == "stop" and faults_at(timed.faults, 3, 2)[2] == {2: 0.5}
    late = TimedFaults([FaultSpec("stop", at_s=0.1, device=0)], start=0, end=3)
    assert late.resolve(2, 5.0) == [] and late.pending  # iteration 3 never runs


def test_durations_end_at_the_commit_that_passes_them():
    """A time-keyed slow starts when resolved, an iteration-keyed one at the commit before its
    iteration (or the origin at the first iteration); each ends at the iteration after the commit
    at or past start + duration_s, and `faults_at` stops applying it there."""
    slow = FaultSpec("slow", at_s=1.0, device=0, severity=0.25, duration_s=2.0)
    link = FaultSpec("link", at_iter=3, src=1, dst=2, severity=0.5, duration_s=0.5)
    first = FaultSpec("slow", at_iter=0, device=3, severity=0.5, duration_s=0.5)
    timed = TimedFaults(check_faults([slow, link, first], range(4)), start=0, end=20)
    on = dataclasses.replace(slow, at_s=None, at_iter=2)
    assert timed.resolve(0, 0.4) == []
    assert timed.resolve(1, 1.1) == [FaultEnd(first, 2), on]
    assert timed.resolve(2, 2.0) == []  # the link starts (iteration 3)
    assert timed.resolve(3, 2.6) == [FaultEnd(link, 4)]
    assert timed.resolve(4, 3.2) == [FaultEnd(on, 5)]
    assert timed.started == {first: 0.0, on: 1.1, link: 2.0} and not timed.active
    assert [faults_at(timed.faults, 0, k)[1] for k in range(6)] == [1, 1, 0.25, 0.25, 0.25, 1]
    assert [faults_at(timed.faults, 2, k)[2] for k in (2, 3, 4)] == [{}, {1: 0.5}, {}]
    assert [faults_at(timed.faults, 3, k)[1] for k in (0, 1, 2)] == [0.5, 0.5, 1]
    assert join_stop([*timed.faults, FaultSpec("stop", at_iter=5, device=0, phase="join")], 0, 6).at_iter == 5


def test_the_latest_active_slow_fault_applies():
    """Of overlapping slow faults the later one applies; when it ends, the earlier one is back."""
    a = FaultSpec("slow", at_iter=1, device=0, severity=0.5)
    b = FaultSpec("slow", at_iter=3, device=0, severity=0.2, duration_s=1.0)
    faults = (a, b, FaultEnd(b, 5))
    assert [faults_at(faults, 0, k)[1] for k in range(6)] == [1, 0.5, 0.5, 0.2, 0.2, 0.5]


def test_a_stop_ends_the_slow_fault_of_its_device():
    """As in the simulator (`core.faults`): a device re-joins healthy; in its stop's iteration the
    slow still applies (a stop in the all-reduce comes after the compute)."""
    faults = (
        FaultSpec("slow", at_iter=1, device=2, severity=0.25),
        FaultSpec("stop", at_iter=3, device=2),
        FaultSpec("rejoin", at_iter=5, device=2),
    )
    assert [faults_at(faults, 2, k)[1] for k in (0, 1, 3, 5, 6)] == [1, 0.25, 0.25, 1, 1]


SPEC = ModelSpec("t", 4, 32, 8, 2, 48, 256)


@pytest.mark.slow
def test_time_keyed_slow_with_a_duration_and_a_time_keyed_stop(tmp_path):
    """tp1 x pp2 x dp2 with every P2P block >= 41 ms (`link_mb_per_s` = 0.1: iterations of >= ~0.15
    s whatever the machine): device 0 computes 5x slower from the first commit (at_s = 0) for 0.3
    s; device 3 stops at 0.5 s. Both land on iterations the controller chose, the slow one ends
    (fault-end), device 3's stop is a fail-stop, and the committed history equals the reference."""
    faults = tmp_path / "faults.toml"
    faults.write_text(
        "[[faults]]\nkind = 'slow'\ndevice = 0\nat_s = 0\nseverity = 0.25\nduration_s = 0.3\n"
        "[[faults]]\nkind = 'stop'\ndevice = 3\nat_s = 0.5\n"
    )
    config = TrainConfig(seq_len=32, microbatches=2, iterations=8, faults=str(faults), link_mb_per_s=0.1)
    plan = Plan.uniform(SPEC, 1, 2, 2, 2)
    res = run_training(config, plan, progress=False)
    ref_losses, _ = reference_for(plan, config)
    assert [row["iter"] for row in res["iterations"]] == list(range(8))
    assert [row["loss"] for row in res["iterations"]] == pytest.approx(ref_losses, rel=1e-4)
    by_kind = {e["kind"]: e for e in res["events"]}
    slow, stop, over = by_kind["inject-slow"], by_kind["inject-stop"], by_kind["fault-end"]
    assert slow["iter"] == 1 and slow["at_s"] == 0 and slow["duration_s"] == 0.3
    assert 1 <= stop["iter"] <= 7 and stop["at_s"] == 0.5 and stop["elapsed_s"] >= 0.5
    assert over["iter"] > slow["iter"] and over["devices"] == [0] and over["lasted_s"] >= 0.3
    stops = [(e["iter"], e["devices"]) for e in res["events"] if e["kind"] == "fail-stop"]
    assert stops == [(stop["iter"], [3])]
    compute = {(r["device"], r["iter"]): r["compute_s"] for r in res["trace"]}
    after = min(compute[0, k] for k in range(over["iter"], 8))
    # p = 0.25: about 4x its own compute while slowed; which iterations the 0.3 s covers depends on the
    # machine's speed, so the slowed compute is the largest over [inject, fault-end), not iteration 1's.
    slowed = max(compute[0, k] for k in range(slow["iter"], over["iter"]))
    assert slowed > 2 * after
    assert alive(res["worker_pids"]) == [], "orphan worker processes"
