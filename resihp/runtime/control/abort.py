"""Leaving a generation on NCCL: abort the communicators, bounded; a member whose abort hangs exits.

Gloo raises within milliseconds when a peer's socket closes, and `destroy_process_group` then
returns (docs/runtime.md, "What happens on a stop"). NCCL does neither: a collective with a dead
peer hangs on the device until the watchdog's timeout, and `destroy_process_group` can hang with
it. So on NCCL the heartbeats decide (the controller learns of a death from the agent or the
heartbeat timeout, as on gloo), and a survivor frees itself from the controller's decision:

* `AbortWatch`, a thread of every NCCL member, polls the store for the controller's `ABORT` of the
  iteration in flight (its own store connection) and then aborts every group's communicators
  (`ProcessGroup.abort()`, meant to be called from another thread; guarded by `hasattr`), keeping
  torch's bookkeeping of the groups. That ends the hung kernels, so a host blocked on the device
  (the synchronisation at STEP, a full launch queue) returns, and the main thread's next call on a
  group raises a `RuntimeError` (`DistBackendError`): the member reports `Abort` and joins the next
  generation like a gloo member;
* leaving a generation tears it down with `bounded(...)`: the abort (`_abort_process_group`,
  torch >= 2.5: every group, inside one NCCL group call, and their bookkeeping; or, after a clean
  generation, the destroy) runs in a thread, and if it has not returned after `ABORT_TIMEOUT_S`
  the member exits with `ABORT_HUNG_EXIT`. Its agent reports the exit, the controller takes it as
  a fail-stop (`"cause": "abort-hung"`) and has a fresh member of the device re-join at the next
  iteration boundary, which takes its state from its peers (the `rejoin` path).

NCCL's own timeout (`NCCL_TIMEOUT_S`) stays a backstop behind the heartbeats; its watchdog is set to
abort the communicators without killing the process (`TORCH_NCCL_ASYNC_ERROR_HANDLING=2`), so a
timeout, too, reaches the main thread as an error.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from datetime import timedelta

import torch.distributed as dist

from .board import Board
from .protocol import Verdict, decision_key

ABORT_TIMEOUT_S = 10.0  # an abort (or destroy) of a generation's groups that takes longer: exit
NCCL_TIMEOUT_S = 60.0  # NCCL operations; heartbeats (3 s) decide long before
POLL_S = 0.05
NCCL_ENV = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}  # watchdog: abort communicators, keep the process
_ONE_AT_A_TIME = threading.Lock()  # the watch's abort and the teardown's never interleave


def abort_groups() -> None:
    """Abort every process group of this process, the default one included (torch's API when it has
    one, else a destroy); once: a second call finds nothing left."""
    with _ONE_AT_A_TIME:
        if not dist.is_initialized():
            return
        abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
        if abort is not None:
            abort()
        else:
            dist.destroy_process_group()


def abort_communicators() -> None:
    """Abort the communicators of every process group, leaving the groups registered (later calls
    on them raise; the teardown's `abort_groups` removes them)."""
    with _ONE_AT_A_TIME:
        if not dist.is_initialized():
            return
        for pg in list(dist.distributed_c10d._world.pg_map):
            if hasattr(pg, "abort"):
                pg.abort()


def destroy_groups() -> None:
    """Destroy every process group (a generation that ended cleanly)."""
    with _ONE_AT_A_TIME:
        if dist.is_initialized():
            dist.destroy_process_group()


def bounded(fn: Callable[[], None], timeout_s: float, on_hang: Callable[[], None]) -> bool:
    """Run `fn()` in a daemon thread; True when it returned within `timeout_s` (its exception is
    re-raised here), else `on_hang()` is called (the member exits) and False returned."""
    done, errors = threading.Event(), []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name="abort", daemon=True).start()
    if not done.wait(timeout_s):
        on_hang()
        return False
    if errors:
        raise errors[0]
    return True


class AbortWatch:
    """Polls `decision/{g}/{k}` of the iteration in flight (`at`) on its own connection to the
    controller's store (at the address of the member's `store`, on whichever host the controller
    runs) and calls `abort()` once when the controller aborted it."""

    def __init__(self, store, abort: Callable[[], None]) -> None:
        store = dist.TCPStore(store.host, store.port, is_master=False, timeout=timedelta(seconds=30))
        self.board, self.abort = Board(store), abort
        self.where: tuple[int, int] | None = None
        self.fired = False
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        threading.Thread(target=self._loop, name="abort-watch", daemon=True).start()

    def at(self, generation: int | None, iteration: int | None = None) -> None:
        """The iteration the member runs now (None: none, between generations)."""
        where = None if generation is None else (generation, iteration)
        with self.lock:
            if where != self.where:  # a new iteration may fire again; the same one never twice
                self.where, self.fired = where, False

    def stop(self) -> None:
        self.stopped.set()

    def _loop(self) -> None:
        while not self.stopped.wait(POLL_S):
            with self.lock:
                where, fired = self.where, self.fired
            if where is None or fired or not self.board.store.check([decision_key(*where)]):
                continue
            if self.board.decision(*where).verdict is Verdict.ABORT:
                with self.lock:
                    self.fired = True
                self.abort()


def nccl_env() -> None:
    """The environment an NCCL member needs before its first process group (kept where set)."""
    for key, value in NCCL_ENV.items():
        os.environ.setdefault(key, value)
