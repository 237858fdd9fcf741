"""Local process helpers of the control plane (torch-free, Linux): is a pid running, watch one, kill one
or a whole tree.

A member watches its agent (`watch`) and an agent forked by its controller that controller
(`orphaned`: its parent), so that no process outlives the one that started it (pids never cross a
host: a remote agent judges its controller by the store, `agent.Reach`); `alive` is the tests'
orphan check; `kill_tree` ends an agent that does not answer together with its forkserver and
members.
"""

from __future__ import annotations

import os
import signal
import threading
import time

WATCH_S = 0.2  # a member checks that its agent runs, an agent that its controller runs, this often


def running(pid: int) -> bool:
    """Whether process `pid` runs (exists and is not a zombie); Linux `/proc`."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def alive(pids: list[int]) -> list[int]:
    """The subset of `pids` still running (not exited, not zombie); tests assert it is empty."""
    return [pid for pid in pids if running(pid)]


def watch(pid: int, on_gone, period_s: float = WATCH_S) -> None:
    """Call `on_gone()` (it ends this process) from a daemon thread once `pid` no longer runs, even
    when it was SIGKILLed: a member watches its agent, an agent its controller."""

    def loop() -> None:
        while running(pid):
            time.sleep(period_s)
        on_gone()

    threading.Thread(target=loop, name=f"watch-{pid}", daemon=True).start()


def orphaned(on_gone, period_s: float = WATCH_S) -> None:
    """Call `on_gone()` (it ends this process) from a daemon thread once this process's parent is
    gone (it was re-parented): an agent that `resihp train` forked on its own host follows it at
    once, without waiting for the store's silence."""
    parent = os.getppid()

    def loop() -> None:
        while os.getppid() == parent:
            time.sleep(period_s)
        on_gone()

    threading.Thread(target=loop, name="orphaned", daemon=True).start()


def kill(pid: int) -> None:
    """SIGKILL `pid` if it still exists."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, their children, ...), from `/proc`'s parent links."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for kid in children.get(todo.pop(), []):
            out.append(kid)
            todo.append(kid)
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL `pid` and every process below it (found first: a killed parent's children are
    adopted elsewhere and no longer look like its own)."""
    for p in [pid, *descendants(pid)]:
        kill(p)
