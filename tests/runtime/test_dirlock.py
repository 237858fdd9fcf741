"""The checkpoint-directory lock: one live run per directory, stale locks taken over with a warning."""

import json
import os
import re
import signal
import socket
import subprocess
import sys

import pytest

from resihp.runtime.state.dirlock import LOCK_NAME, acquire, check_free, holder

HOLD = (
    "import sys; from resihp.runtime.state.dirlock import acquire; "
    "lock = acquire(sys.argv[1]); print('held', flush=True); sys.stdin.read(); lock.release()"
)


def _holder_process(directory):
    """A separate live process that holds `directory` until its stdin closes (then releases it) or
    it is killed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(directory)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_acquire_writes_the_holder_and_release_removes_the_lock(tmp_path):
    """The lock file names this process and host while held, and is gone once released."""
    directory = tmp_path / "ckpt"  # created by acquire
    with acquire(str(directory)) as lock:
        body = json.loads((directory / LOCK_NAME).read_text())
        assert body["pid"] == os.getpid() and body["host"] == socket.gethostname()
        assert lock.held and holder(str(directory))["pid"] == os.getpid()
    assert not lock.held and not (directory / LOCK_NAME).exists()
    assert holder(str(directory)) is None
    acquire(str(directory)).release()  # free again


def test_a_second_live_run_is_refused_naming_the_directory_and_holder(tmp_path):
    """Another process holds the directory: acquire and check_free refuse, with its pid and host."""
    proc = _holder_process(tmp_path)
    try:
        host = socket.gethostname()
        expected = re.escape(
            f"--checkpoint-dir {tmp_path}: in use by the run of pid {proc.pid} on host {host}"
        )
        with pytest.raises(ValueError, match=expected):
            acquire(str(tmp_path), "--checkpoint-dir")
        with pytest.raises(ValueError, match=expected):
            check_free(str(tmp_path), "--checkpoint-dir")
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)
    # the holder ended normally: its lock is released, the next run takes it without a warning
    warnings = []
    acquire(str(tmp_path), warn=warnings.append).release()
    assert warnings == []


def test_a_stale_lock_of_a_killed_run_is_taken_over_with_a_warning(tmp_path):
    """SIGKILL leaves the lock file (the kernel drops the flock): free, and taken over with one line."""
    proc = _holder_process(tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    assert (tmp_path / LOCK_NAME).exists() and holder(str(tmp_path)) is None
    check_free(str(tmp_path))  # a stale lock does not refuse
    warnings = []
    with acquire(str(tmp_path), warn=warnings.append):
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert len(warnings) == 1
    assert f"taking over the lock of pid {proc.pid} on host {socket.gethostname()}" in warnings[0]


def test_two_locks_in_one_process_also_conflict(tmp_path):
    """The lock is per acquire, not per process: a second acquire in the holder itself is refused."""
    with acquire(str(tmp_path)):
        with pytest.raises(ValueError, match=f"pid {os.getpid()}"):
            acquire(str(tmp_path))
