"""How the control plane's messages move between processes: the only module that knows that wire.

A `Channel` is one direction of messages (`protocol.encode` / `decode`, bytes on the wire): the
controller's inbox (members and agents -> controller), each agent's command channel (controller ->
agent) and each agent's heartbeat channel (members -> agent). Today a channel is a `multiprocessing`
queue of one host (`Transport` makes them, in the `spawn` context, and a channel is handed to a
child process as a `Process` argument); any object with `put(bytes)`, `get(timeout=)` and
`get_nowait()` can stand in for the queue (the tests use `queue.Queue`).

A transport between hosts (agents on other machines, architecture §6: "the c10d store is the only
wire") replaces `Transport` and `Channel` here; nothing else changes. What the controller tells
the members already goes through the c10d store (`board.py`).

Torch-free: the node agents import it.
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_mod

from .protocol import decode, encode
from .signals import quiet_resource_tracker


class Channel:
    """One direction of typed messages. `recv(timeout_s)`: the next message, waiting up to
    `timeout_s` (0: only one already there), None when none came."""

    def __init__(self, queue) -> None:
        self.queue = queue

    def send(self, msg) -> None:
        self.queue.put(encode(msg))

    def recv(self, timeout_s: float = 0.0):
        try:
            data = self.queue.get(timeout=timeout_s) if timeout_s > 0 else self.queue.get_nowait()
        except queue_mod.Empty:
            return None
        return decode(data)

    def flush(self) -> None:
        """The sender's last word: close its end and wait until every message sent is delivered
        (a process that then exits or freezes holds no lock of the channel)."""
        self.queue.close()
        self.queue.join_thread()

    def close(self) -> None:
        """Close this end; messages still buffered are delivered in the background."""
        self.queue.close()

    def abandon(self) -> None:
        """Nobody reads this channel any more: exiting must not wait for its buffered messages."""
        self.queue.cancel_join_thread()


class Transport:
    """Makes the channels of a job whose processes share one host."""

    def __init__(self) -> None:
        self.ctx = mp.get_context("spawn")  # a fresh interpreter: an agent never imports torch
        quiet_resource_tracker()  # it unlinks the queues' semaphores if we are killed, silently

    def channel(self) -> Channel:
        return Channel(self.ctx.Queue())
