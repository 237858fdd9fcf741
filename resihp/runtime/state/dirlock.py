"""The lock a running job holds on its checkpoint directory, so that two runs never write one.

`acquire(directory)` creates the directory if needed and takes an exclusive `flock` on
`directory/resihp.lock`, then writes the holder — {"pid", "host", "since"} — into it. The kernel
drops a flock when its process dies, however it dies, so a lock is never held by a dead process;
what a dead process leaves is the file with its holder in it: the next run takes it over and warns
(one line) that it did. A second live run is refused up front: ValueError naming the directory and
the holder's pid and host. `release()` (or leaving the `with` block) removes the file, then drops
the flock.

The flocked file must still be the one at the path (a releasing holder unlinks it while another
run may have it open): `acquire` checks the inode after locking and retries if it changed. Torch-free;
the lock is not inherited by child processes (Python opens files close-on-exec). On a shared file
system, flock is as good as the file system's lock support (NFS v4: yes).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Callable

LOCK_NAME = "resihp.lock"


def _warn(msg: str) -> None:
    print(f"resihp: warning: {msg}", file=sys.stderr)


def _holder_text(holder: dict) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("since", 0)))
    return f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')} (since {since})"


def _read(fd: int) -> dict | None:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 4096)
    if not raw.strip():
        return None
    try:
        holder = json.loads(raw)
    except ValueError:
        return {"pid": "?", "host": "?"}
    return holder if isinstance(holder, dict) else {"pid": "?", "host": "?"}


def _in_use(what: str, directory: str, holder: dict) -> str:
    return (
        f"{what} {directory}: in use by the run of {_holder_text(holder)}; wait for it to end or "
        "give another directory"
    )


class DirLock:
    """A held lock on `directory` (see the module docstring)."""

    def __init__(self, directory: str, fd: int) -> None:
        self.directory, self.path, self._fd = directory, os.path.join(directory, LOCK_NAME), fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Remove the lock file and drop the lock (idempotent)."""
        if self._fd is None:
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        os.close(self._fd)  # drops the flock
        self._fd = None

    def __enter__(self) -> DirLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def acquire(directory: str, what: str = "run.checkpoint_dir", warn: Callable[[str], None] = _warn) -> DirLock:
    """Lock `directory` for this process; ValueError when another live process holds it.
    `what` names the directory as the user gave it (for messages)."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, LOCK_NAME)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held_by = _read(fd) or {}
            os.close(fd)
            raise ValueError(_in_use(what, directory, held_by)) from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder released (and unlinked) it between our open and flock: retry
    stale = _read(fd)
    if stale is not None:
        warn(f"{what} {directory}: taking over the lock of {_holder_text(stale)}, which no longer runs")
    body = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()})
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, body.encode() + b"\n")
    os.fsync(fd)
    return DirLock(directory, fd)


def check_free(directory: str, what: str = "run.checkpoint_dir") -> None:
    """ValueError (the message `acquire` would give) when a live process holds `directory`."""
    held_by = holder(directory)
    if held_by is not None:
        raise ValueError(_in_use(what, directory, held_by))


def holder(directory: str) -> dict | None:
    """The holder of a live lock on `directory`, or None when nobody holds one (a stale lock file
    counts as free). Does not take the lock."""
    path = os.path.join(directory, LOCK_NAME)
    try:
        fd = os.open(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read(fd) or {}
    finally:
        os.close(fd)
    return None
