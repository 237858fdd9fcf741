"""How a failure is handled and told, without processes: when the controller replans (`failover`),
what a stopped job advises (`recovery`), the events as they are made (`events`), their live lines
(`live`), and the signals the controller takes over (`signals`)."""

import io
import os
import signal
import subprocess
import sys

import pytest

from resihp.core.faults import FaultSpec
from resihp.core.model_spec import ModelSpec
from resihp.core.plan import Plan, Stage
from resihp.runtime import Interrupted, JobSpec, WorkerFailed
from resihp.runtime.adapt.recovery import advice, lost_layers
from resihp.runtime.adapt.rollback import Snapped
from resihp.runtime.control.events import EventLog
from resihp.runtime.control.failover import Failover, at_rest
from resihp.runtime.control.liveness import JoinBarrier
from resihp.runtime.control.protocol import Gate, Verdict
from resihp.runtime.control.signals import StopSignals, shielded
from resihp.runtime.faults import TimedFaults
from resihp.runtime.live import Progress

SPEC = ModelSpec("t", 4, 32, 8, 2, 48, 256)


class Board:
    """The controller's board, recording what is written."""

    def __init__(self):
        self.gates, self.decisions = {}, {}

    def gate(self, g, gate):
        self.gates[g] = gate

    def decide(self, g, it, decision):
        self.decisions[(g, it)] = decision.verdict


def test_a_failure_is_quiescent_only_once_every_live_member_is_at_rest():
    """After `go`: a member at rest reported its abort, or is a standby member done with its join; a
    member that will die with the first one never reports, so the failure waits for its death.
    Before `go`: members at the barrier, or still starting, are at rest."""
    members, plan = {0, 1, 2, 3, 7}, [0, 1, 2, 3, 6, 7]  # 6 died; 7 dies too, later; 4 is standby
    assert not at_rest(members, plan, gated_off=False, aborted={0, 1, 2, 3})  # 7 is on its way out
    assert at_rest(members - {7}, plan, gated_off=False, aborted={0, 1, 2, 3})
    assert not at_rest(members | {4}, plan, gated_off=False, aborted=members)  # standby 4 still joining
    assert at_rest(members | {4}, plan, gated_off=False, aborted=members, joined={4})
    assert not at_rest({0, 1}, [0, 1], gated_off=False, aborted={0}, joined={1})  # a plan device must abort
    assert not at_rest({0, 1, 5}, [0, 1], gated_off=True, arrived={0})
    assert at_rest({0, 1, 5}, [0, 1], gated_off=True, arrived={0, 1}, starting={5})


def test_failover_aborts_at_once_waits_for_the_survivors_and_measures_the_recovery():
    """The first death aborts the iteration in flight and every generation not yet gone; a second
    death joins the open failure; the survivors' aborts make it quiescent; the measurement spans
    the first stop to the commit of the re-run iteration and lands on the last fail-stop event."""
    board, barrier = Board(), JoinBarrier()
    barrier.open(0, [0, 1, 2, 3])
    barrier.decide(0, Gate.GO)
    barrier.open(1, [0, 1, 2, 3])  # a planned replan, not yet at its rendezvous
    fails = Failover(board, barrier, Snapped({}))
    plans = [Plan.uniform(SPEC, 1, 2, 2, 2)] * 2
    assert fails.lose(1, 5, [3]) and not fails.lose(1, 5, [2])
    assert board.gates == {1: Gate.ABORT} and board.decisions == {(1, 5): Verdict.ABORT}
    assert fails.open.dead == [3, 2]
    assert fails.quiescent({0, 1}, plans, {})  # generation 1 never went: nobody touches its groups
    fails.abort(0, 0, "RuntimeError: closed", current=1, snapshot=None)  # stale: not a failed collective now
    fails.abort(1, 1, "Aborted: iteration 5 aborted", current=1, snapshot=5)  # its snapshots of 5: complete
    assert fails.noticed == {0: {0: "RuntimeError: closed"}, 1: {1: "Aborted: iteration 5 aborted"}}
    assert fails.unexplained(0.0) == {} and fails.snapped.reached == {1: {1: 5}}
    t_detect = fails.open.t_detect
    fails.replanned({3: t_detect - 0.5, 2: t_detect - 0.2}, 0.01, generation=2)
    assert fails.open is None and fails.measured["detect_s"] == pytest.approx(0.5)
    events = [
        {"iter": 5, "kind": "fail-stop", "devices": [3]},
        {"iter": 5, "kind": "fail-stop", "devices": [2]},
    ]
    stop = fails.committed(events, {2: []})
    assert (
        stop is events[1]
        and stop["recovery"]["kill_to_commit_s"] >= 0.5
        and fails.committed(events, {}) is None
    )


def test_an_abort_with_no_death_is_unexplained_after_the_grace():
    fails = Failover(Board(), JoinBarrier(), Snapped({}))
    fails.abort(0, 4, "RuntimeError: timeout", current=0, snapshot=None)
    assert fails.unexplained(60.0) == {}
    assert fails.unexplained(0.0) == {
        4: "reported a failed collective, no process died: RuntimeError: timeout"
    }
    fails.lose(0, 1, [5])  # a death explains it
    assert fails.unexplained(0.0) == {}


def test_a_stopped_job_says_what_was_lost_and_what_to_do():
    """The layers no survivor holds, as ranges; the way on: the newest checkpoint this run wrote,
    else the one it resumed from, else (a failure) rerun with checkpoints."""
    plan = Plan.uniform(SPEC, 1, 2, 2, 2)  # layers 0-1 on 0 and 2, layers 2-3 on 1 and 3
    assert lost_layers(plan, {0, 2}) == "layers 2-3" and lost_layers(plan, {0, 3}) == ""
    assert lost_layers(Plan.uniform(SPEC, 1, 4, 1, 1), {1, 2}) == "layers 0, 3"
    job = JobSpec(spec=SPEC, workload=None, checkpoint_dir="ck", checkpoint_every=2)
    saved = [{"iter": 2, "kind": "checkpoint"}, {"iter": 4, "kind": "checkpoint"}]
    assert advice(job, saved) == (
        "the checkpoint at iteration 4 keeps the state: resume with `resihp train --resume ck` "
        "(same --config)"
    )
    resumed = JobSpec(spec=SPEC, workload=None, start_iteration=6, resume="ck/iter_00000006")
    assert "iteration 6" in advice(resumed, []) and "--resume ck/iter_00000006" in advice(resumed, [])
    assert advice(JobSpec(spec=SPEC, workload=None), []).startswith(
        "no checkpoint: rerun with --checkpoint-every"
    )
    assert advice(JobSpec(spec=SPEC, workload=None), [], failed=False) == ""


def test_events_are_handed_on_as_made_with_the_injected_faults_of_each_iteration():
    """Iteration-keyed faults appear as the iteration is about to run, time-keyed ones once resolved
    (with when); a completed event is handed on again; the stop of a job is its last event."""
    seen = []
    plans = [Plan.uniform(SPEC, 1, 2, 2, 2)]
    log = EventLog(plans, lambda e, p: seen.append((e["kind"], e["iter"], p is plans)))
    timed = TimedFaults(
        [FaultSpec("stop", at_iter=2, device=3), FaultSpec("slow", at_s=0.5, device=1, severity=0.5)], 0, 8
    )
    log.inject(timed, 1)
    log.inject(timed, 2)
    timed.resolve(3, 0.7)
    log.inject(timed, 4)
    log.emit({"iter": 2, "kind": "fail-stop", "devices": [3]})
    log.completed(log.events[-1])
    log.stop(Interrupted(signal.SIGTERM, []), 5, 1)
    log.stop(WorkerFailed("devices [3] stopped\ntraceback", [3], []), 5, 1)
    assert [(k, i) for k, i, _ in seen] == [
        ("inject-stop", 2), ("inject-slow", 4), ("fail-stop", 2), ("fail-stop", 2), ("interrupted", 5),
        ("job-failed", 5),
    ]  # fmt: skip
    assert all(same for *_, same in seen) and len(log.events) == 5
    slow = log.events[1]
    assert slow == {
        "iter": 4,
        "kind": "inject-slow",
        "devices": [1],
        "severity": 0.5,
        "at_s": 0.5,
        "elapsed_s": 0.7,
    }
    assert log.events[3]["signal"] == "SIGTERM" and log.events[4]["error"] == "devices [3] stopped\ntraceback"


def test_live_lines_are_one_per_event_in_order_and_quiet_prints_none():
    """Plain lines (no TTY): iteration progress and one line per event as it comes, the fail-stop
    again once recovered, a replan with the stages it changed; a state transfer is not shown."""
    gen0 = Plan.uniform(SPEC, 1, 2, 2, 2).with_changes(standby=(4,))  # replica 1: stages on 2, 3
    r1 = (gen0.replicas[1][0], Stage((4,), (2, 4), (8,), (48,)))
    plans = [gen0, Plan(SPEC, (gen0.replicas[0], r1), gen0.microbatches, generation=1)]
    stop = {"iter": 2, "kind": "fail-stop", "devices": [3], "cause": "exit"}
    replan = {
        "iter": 2,
        "kind": "replan",
        "generation": 1,
        "devices": [0, 1, 2, 4],
        "reason": "resihp: balance",
    }
    out = io.StringIO()
    bar = Progress(8, stream=out)
    bar.event(stop, plans)
    bar.event(replan, plans)
    bar.event({"iter": 2, "kind": "state-transfer", "generation": 1}, plans)
    bar.update({"iter": 2, "loss": 5.0, "generation": 1}, 40.0)
    bar.event({**stop, "recovery": {"kill_to_commit_s": 0.61, "detect_s": 0.05, "plan_s": 0.1}}, plans)
    assert out.getvalue().splitlines() == [
        "fail-stop     iter 2: device [3] died (exit)",
        "replan        iter 2: generation 1 on 4 devices (resihp: balance): r1s1 [4] L2-3 heads [8]",
        "iter 3/8  loss 5.0000  samples/s 40.0  gen 1",
        "recovered     iter 2: device [3] in 0.61 s (detect 0.05, plan 0.10)",
    ]
    quiet = io.StringIO()
    bar = Progress(8, enabled=False, stream=quiet)
    bar.event(stop, plans)
    bar.update({"iter": 2, "loss": 5.0, "generation": 1}, 40.0)
    assert quiet.getvalue() == ""


def test_stop_signals_are_recorded_and_raised_at_the_next_check():
    """While active, SIGINT / SIGTERM only record the first signal; `check` raises Interrupted; the
    previous handlers come back."""
    before = signal.getsignal(signal.SIGTERM)
    with StopSignals([11, 12]) as stop:
        stop.check()
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.signum == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGINT)  # a second signal does not replace the first
        with pytest.raises(Interrupted) as got:
            stop.check()
    assert got.value.signum == signal.SIGTERM and got.value.pids == [11, 12]
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_child_started_shielded_cannot_be_interrupted_before_it_ignores_sigint():
    """A process started under `shielded` begins with SIGINT and SIGTERM blocked (the mask crosses
    fork and exec); `shield` then ignores both and unblocks them."""
    code = (
        "import signal\n"
        "from resihp.runtime.control.signals import shield\n"
        "mask = lambda: sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))\n"
        "blocked = mask()\n"
        "shield()\n"
        "print(blocked, mask(), signal.getsignal(signal.SIGINT) is signal.SIG_IGN,"
        " signal.getsignal(signal.SIGTERM) is signal.SIG_IGN)\n"
    )
    with shielded():
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[2, 15] [] True True", out.stderr
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == set()  # this process: unblocked again
