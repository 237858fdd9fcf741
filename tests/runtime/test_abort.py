"""Leaving a generation on NCCL (`control/abort.py`): a bounded abort, the exit of a member whose
abort hangs, and the watch that aborts on the controller's decision. On CPU with an injected abort
that never returns."""

import multiprocessing as mp
import threading
import time
from datetime import timedelta

import torch.distributed as dist

from resihp.core.model_spec import model_preset
from resihp.runtime.control import member
from resihp.runtime.control.abort import AbortWatch, bounded
from resihp.runtime.control.board import Board
from resihp.runtime.control.liveness import HeartbeatThread
from resihp.runtime.control.protocol import ABORT_HUNG_EXIT, Decision, Kind, Verdict
from resihp.runtime.control.transport import Transport


def _hang() -> None:
    threading.Event().wait()  # an abort that never returns


def test_bounded_returns_raises_or_gives_up():
    """A quick function returns True, its exception reaches the caller; one that hangs is given up
    after the bound and `on_hang` runs."""
    hung = []
    assert bounded(lambda: None, 1.0, lambda: hung.append(1)) is True and hung == []
    try:
        bounded(lambda: 1 / 0, 1.0, lambda: hung.append(1))
    except ZeroDivisionError:
        pass
    else:
        raise AssertionError("the exception was lost")
    t0 = time.perf_counter()
    assert bounded(_hang, 0.2, lambda: hung.append(1)) is False
    assert hung == [1] and 0.2 <= time.perf_counter() - t0 < 1.0


def _leave_with_a_hanging_abort(results, beats) -> None:
    """A member process leaving a failed NCCL generation whose abort hangs (bound shortened)."""
    member.ABORT_TIMEOUT_S = 0.3
    heart = HeartbeatThread(7, beats)
    member._teardown(nccl=True, failed=True, abort=_hang, on_hang=member._hung(7, results, heart))
    raise AssertionError("the member went on after its abort hung")


def test_a_member_whose_abort_hangs_exits_with_its_code():
    """The member says when it stops, then exits with `ABORT_HUNG_EXIT` (what its agent reports and
    the controller turns into a fail-stop and a re-join) shortly after the bound."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    transport = Transport("127.0.0.1", store.port)
    results, beats = transport.inbox(), transport.beats(0)
    proc = mp.get_context("spawn").Process(target=_leave_with_a_hanging_abort, args=(results, beats))
    proc.start()
    proc.join(60)
    assert proc.exitcode == ABORT_HUNG_EXIT, proc.exitcode
    msg = results.recv(5.0)
    assert msg is not None and msg.kind is Kind.STOPPING and msg.device == 7
    transport.close()


def test_the_watch_aborts_once_when_the_controller_aborts_the_iteration():
    """The watch, connecting to the controller's store wherever it listens (127.0.0.2 here, as on
    another host), ignores a committed iteration and fires once for an aborted one."""
    timeout = timedelta(seconds=10)
    store = dist.TCPStore("127.0.0.2", 0, is_master=True, wait_for_workers=False, timeout=timeout)
    board, fired = Board(store), []
    watch = AbortWatch(store, lambda: fired.append(time.perf_counter()))
    try:
        board.decide(0, 3, Decision(Verdict.COMMIT))
        watch.at(0, 3)
        time.sleep(0.3)
        assert fired == []
        watch.at(0, 4)
        t0 = time.perf_counter()
        board.decide(0, 4, Decision(Verdict.ABORT))
        deadline = time.monotonic() + 5
        while not fired and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        assert len(fired) == 1 and fired[0] - t0 < 1.0, fired
    finally:
        watch.stop()


def test_the_controller_has_a_member_whose_abort_hung_rejoin():
    """A member that exited with `ABORT_HUNG_EXIT` is a fail-stop with cause `abort-hung`, and its
    device is due to re-join at the next iteration boundary (no process is started here)."""
    from resihp.core.plan import Plan
    from resihp.runtime.config import TrainConfig
    from resihp.runtime.control.controller import Controller

    config = TrainConfig(tp=1, pp=2, dp=2, workers=4, seq_len=32, iterations=6)
    plan = Plan.uniform(model_preset("tiny"), 1, 2, 2, 2)
    c = Controller(
        plan, config.job_spec(plan), faults=(), replans=(), on_commit=None, on_event=None, detect_slow=False,
        policy=None, heartbeat_timeout_s=3.0, start_timeout_s=60.0, devices_per_node=None,
    )  # fmt: skip
    try:
        c.joined_devs[0] = set(plan.devices())
        c.members = set(plan.devices())
        c.it = 2
        c.procs.agents.code[3] = ABORT_HUNG_EXIT
        c.lose([3])
        stop = next(e for e in c.log.events if e["kind"] == "fail-stop")
        assert (stop["devices"], stop["cause"]) == ([3], "abort-hung")
        assert c.due.rejoins == {3: [3]} and 3 not in c.members
    finally:
        c.procs.close(0.0)
        c.transport.close()
