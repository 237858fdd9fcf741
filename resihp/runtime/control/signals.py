"""Signals and the terminal: the controller stops on SIGINT / SIGTERM at a safe point, its children
ignore both and stay quiet when the controller dies.

The terminal sends SIGINT (Ctrl-C) to its whole foreground process group: the controller, every
node agent, every agent's forkserver and every member. A KeyboardInterrupt raised in each of them at
a random point printed one traceback per process and tore the job down in no order. Instead:

* `StopSignals` (the controller, for the duration of a run): SIGINT and SIGTERM only record the
  signal; the controller's loop calls `check()` at every turn (at most 50 ms apart) and raises
  `job.Interrupted`, so the job is torn down by its ordinary path — agents shut down, members
  reaped, the committed iterations kept — never by an exception from inside a handler. Outside the
  main thread (signals reach only it) it does nothing.
* `shielded()` (the controller, around starting an agent): SIGINT and SIGTERM are blocked while the
  child is forked and exec'd — a blocked mask is inherited across both, a Python handler is not —
  so the agent cannot be interrupted while its interpreter starts; `shield()`, the agent's first
  act, ignores both and unblocks them. Its forkserver inherits the ignored signals (an ignored
  disposition survives exec) and every member it forks keeps them. The controller alone stops its
  children (`Shutdown`, SIGKILL): a SIGTERM sent to the whole group (a service manager, `kill
  -TERM -PGID`) must not kill the agents under a controller that is about to stop them in order —
  it would see a dead node, and recover, first.
* `quiet_children()` (an agent, before its forkserver starts): members log torch's C++ messages
  from level ERROR up (`TORCH_CPP_LOG_LEVEL`, read when torch loads; a value the user set wins).
  When the controller dies, every member's store client fails and torch printed a warning with a
  30-line C++ stack for each (`TCPStore recvVector failed`); the error itself still reaches Python.
* `quiet_resource_tracker()` (the controller, before its first queue): multiprocessing's resource
  tracker (a child process that unlinks the queues' semaphores if their creator dies) is started
  with its stderr on /dev/null: after a SIGKILL of the controller it cleans up, but printed
  "There appear to be 9 leaked semaphore objects" on the terminal.

Torch-free (the agents import it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

from ..job import Interrupted

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """A context manager: while it is active (in the main thread), SIGINT and SIGTERM set `signum`
    (the first one received) instead of acting; `check()` raises `Interrupted` once one came. The
    previous handlers come back on exit."""

    def __init__(self, pids: list[int] | None = None) -> None:
        self.signum: int | None = None
        self.pids = pids if pids is not None else []  # every process started (Interrupted.pids)
        self.previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self.previous[sig] = signal.signal(sig, self._record)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous.clear()

    def _record(self, signum: int, frame) -> None:
        self.signum = self.signum or signum

    def check(self) -> None:
        if self.signum is not None:
            raise Interrupted(self.signum, self.pids)


@contextlib.contextmanager
def shielded():
    """Block SIGINT and SIGTERM in this thread for the duration (a child started meanwhile inherits
    the mask; `shield` unblocks it there). A signal that arrives meanwhile is delivered after."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def shield() -> None:
    """In a child started under `shielded`: ignore SIGINT and SIGTERM (its parent stops it), then
    unblock them."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def quiet_children() -> None:
    """Processes this one starts from now on log torch's C++ messages from ERROR up only."""
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")


def quiet_resource_tracker() -> None:
    """Start multiprocessing's resource tracker, if it does not run yet, with stderr on /dev/null."""
    from multiprocessing import resource_tracker

    saved = os.dup(2)  # the process's stderr, whatever `sys.stderr` is (a test's capture, say)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        sys.stderr.flush()
        os.dup2(null, 2)
        resource_tracker.ensure_running()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)
