"""How the control plane's messages move between processes: the only module that knows that wire.

The wire is the controller's c10d `TCPStore` (architecture §6: "the c10d store is the only wire"):
what the controller tells the members lives under the store's keys (`board.py`), and every message
that flows the other way, or to and from an agent, is a `Channel` — one direction of messages
(`protocol.encode` / `decode`, bytes on the wire) kept in one store queue key:

* `INBOX`: the controller's (members and agents -> controller), a `StoreLog`;
* `commands_key(node)`: node `node`'s agent's commands (controller -> agent);
* `beats_key(node)`: its members' heartbeats (members -> agent);

and a counter per node, `fence_key(node)`, that the controller bumps when it fences the node.

The names are fixed by the node rank, so an agent started on another machine (`resihp agent`)
knows its channels from `--node-rank` and the controller's address alone. A send is one
`queue_push` (delivered when it returns: nothing is buffered in the sender, so a process killed or
frozen right after holds nothing of the channel); a receive pops (`queue_pop`, non-blocking,
polled with a short back-off while a `recv` waits), so a queue holds only what its one reader has
not taken yet and the reader drains it every turn. The controller's inbox, which every member
writes every iteration, is a `StoreLog` instead: a send is one `append` of a length-framed message,
and the controller takes every message there in one batched read (two `compare_set`s) where a
queue pops one message per round trip. No pid, clock or path crosses the wire.

A `StoreQueue` pickles as its address (host, port, key): a channel handed to a child process
reconnects there, through one client per process and address (`_client`; the c10d client is
thread-safe). These clients never block — no `wait`, no blocking `get` — so a heartbeat thread
never queues behind a long store wait of its process (the members' own store client does those).
A store that cannot be reached raises `Unreachable` (an `OSError`, as a closed queue raised
before); the next call reconnects. Any object with `put(bytes)`, `get(timeout=)` and
`get_nowait()` (raising `queue.Empty`) can stand in for a `StoreQueue` (the tests use
`queue.Queue`).

Torch-free at import: torch.distributed is imported on the first connection.
"""

from __future__ import annotations

import os
import queue as queue_mod
import socket
import struct
import threading
import time
from collections import deque
from datetime import timedelta

from .protocol import decode, encode

INBOX = "resihp/controller"
CONNECT_TIMEOUT_S = 30.0  # a process's first connection (a loaded store answers many at once slowly)
RECONNECT_TIMEOUT_S = 1.0  # an attempt after a failure (a reconnecting agent tries again)
OP_TIMEOUT_S = 10.0  # one call on a connected client (a loaded store answers late, not never)
POLL_S = (0.0005, 0.005)  # a waiting `recv` polls its queue first this often, backing off to that


def commands_key(node: int) -> str:
    return f"resihp/agent/{node}/commands"


def beats_key(node: int) -> str:
    return f"resihp/agent/{node}/beats"


def fence_key(node: int) -> str:
    return f"resihp/agent/{node}/fenced"


class Unreachable(OSError):
    """The store cannot be reached (the controller is gone, or its host)."""


_clients: dict[tuple, object] = {}  # (pid, host, port) -> this process's non-blocking client
_failures: dict[tuple, int] = {}  # (pid, host, port) -> connections that failed or broke
_reconnect = [True]  # whether this process connects again after a failure (`never_reconnect`)
_lock = threading.Lock()


def load_quietly(user_level: bool) -> None:
    """Import torch.distributed (the store client) with torch's C++ log off, unless the user set its
    level (`user_level`: `TORCH_CPP_LOG_LEVEL` was set before this process touched it; torch reads
    it once, at that import): an agent retrying a controller that is gone would print torch's
    connect errors at every attempt; it says what happened in one line of its own. The variable is
    restored afterwards (the processes started later log as it says)."""
    if user_level:
        import torch.distributed  # noqa: F401

        return
    before = os.environ.get("TORCH_CPP_LOG_LEVEL")
    os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"
    try:
        import torch.distributed  # noqa: F401
    finally:
        if before is None:
            del os.environ["TORCH_CPP_LOG_LEVEL"]
        else:
            os.environ["TORCH_CPP_LOG_LEVEL"] = before


def _client(host: str, port: int):
    """This process's client of the store at (`host`, `port`). One connection attempt at a time: a
    caller that waited for another thread's failed attempt fails with it, at once."""
    key = (os.getpid(), host, port)
    failures = _failures.get(key, 0)
    with _lock:
        if key not in _clients:
            if _failures.get(key, 0) != failures or (failures and not _reconnect[0]):
                raise Unreachable(f"store {host}:{port}: not reachable")
            import torch.distributed as dist

            timeout_s = RECONNECT_TIMEOUT_S if failures else CONNECT_TIMEOUT_S
            try:  # a refused or silent address fails at once (torch retries for ~2x its timeout)
                socket.create_connection((host, port), timeout_s).close()
            except OSError as e:
                _failures[key] = failures + 1
                raise Unreachable(f"store {host}:{port}: {e}") from None
            try:
                _clients[key] = dist.TCPStore(
                    host, port, is_master=False, timeout=timedelta(seconds=timeout_s),
                    wait_for_workers=False,
                )  # fmt: skip
            except RuntimeError as e:  # DistNetworkError, DistStoreError
                _failures[key] = failures + 1
                raise Unreachable(f"store {host}:{port}: {_first_line(e)}") from None
            _clients[key].set_timeout(timedelta(seconds=OP_TIMEOUT_S))
        return _clients[key]


def _drop(host: str, port: int) -> None:
    """Forget a client that failed: the next call connects afresh (unless `never_reconnect`)."""
    key = (os.getpid(), host, port)
    with _lock:
        if _clients.pop(key, None) is not None:
            _failures[key] = _failures.get(key, 0) + 1


def never_reconnect() -> None:
    """From now on this process gives a store up at its first failure (a member: its agent fences
    the node; a reconnect attempt would only print torch's connect errors on the way out)."""
    _reconnect[0] = False


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _store_op(host: str, port: int, op: str, *args):
    """`op(*args)` on this process's client of the store: an empty queue raises `queue.Empty`, a
    store out of reach `Unreachable` (and the client is dropped: the next call reconnects)."""
    store = _client(host, port)
    try:
        return getattr(store, op)(*args)
    except RuntimeError as e:
        import torch.distributed as dist

        if isinstance(e, dist.QueueEmptyError):
            raise queue_mod.Empty from None
        _drop(host, port)
        raise Unreachable(f"store {host}:{port}: {_first_line(e)}") from None


class _Waits:
    """`get(timeout)` of a store channel: its `get_nowait`, polled with a short back-off."""

    def get_nowait(self) -> bytes:
        raise NotImplementedError

    def get(self, timeout: float) -> bytes:
        deadline, pause = time.monotonic() + timeout, POLL_S[0]
        while True:
            try:
                return self.get_nowait()
            except queue_mod.Empty:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                time.sleep(min(pause, left))
                pause = min(2 * pause, POLL_S[1])


class StoreQueue(_Waits):
    """One queue key of the store at (`host`, `port`); `put`, `get`, `get_nowait` as `queue.Queue`'s."""

    def __init__(self, host: str, port: int, key: str) -> None:
        self.host, self.port, self.key = host, port, key

    def __getstate__(self):
        return (self.host, self.port, self.key)

    def __setstate__(self, state) -> None:
        self.host, self.port, self.key = state

    def _call(self, op: str, *args):
        return _store_op(self.host, self.port, op, self.key, *args)

    def put(self, data: bytes) -> None:
        self._call("queue_push", data)

    def get_nowait(self) -> bytes:
        return self._call("queue_pop", False)

    def __len__(self) -> int:
        """Messages not taken yet."""
        return self._call("queue_len")

    def delete(self) -> None:
        """Drop what is left in the queue (its reader is gone for good)."""
        self._call("delete_key")


_FRAME = struct.Struct("<I")  # a `StoreLog` message's length, before its bytes


class StoreLog(_Waits):
    """An append-only key of the store at (`host`, `port`) read as a queue that hands out many
    messages per round trip: `put` appends one length-framed message; `get_nowait` hands out the
    messages the last read took, and reads again when none is left: `compare_set(key, b"", b"")`
    (creates the key empty if missing, else returns what it holds), then `compare_set(key, data,
    b"")`, which empties it if it still holds exactly `data` (else it returns what it holds now,
    the messages appended meanwhile included, and the next try takes that). An empty poll is one
    round trip, as a pop; a read of n messages two (more only while senders append meanwhile).
    Each sender's messages come out in the order sent. It pickles as its address, as a
    `StoreQueue` does."""

    def __init__(self, host: str, port: int, key: str) -> None:
        self.__setstate__((host, port, key))

    def __getstate__(self):
        return (self.host, self.port, self.key)

    def __setstate__(self, state) -> None:
        self.host, self.port, self.key = state
        self.taken: deque[bytes] = deque()  # read from the store, not handed out yet

    def _cas(self, expected: bytes) -> bytes:
        return _store_op(self.host, self.port, "compare_set", self.key, expected, b"")

    def put(self, data: bytes) -> None:
        _store_op(self.host, self.port, "append", self.key, _FRAME.pack(len(data)) + data)

    def get_nowait(self) -> bytes:
        if not self.taken:
            data = self._cas(b"")
            while data:
                now = self._cas(data)
                if now == b"":  # emptied: `data` is this reader's
                    self.taken.extend(_frames(data))
                    break
                data = now
        if not self.taken:
            raise queue_mod.Empty
        return self.taken.popleft()

    def __len__(self) -> int:
        """Messages not taken yet."""
        return len(self.taken) + sum(1 for _ in _frames(self._cas(b"")))


def _frames(data: bytes):
    at = 0
    while at < len(data):
        (n,) = _FRAME.unpack_from(data, at)
        yield data[at + _FRAME.size : at + _FRAME.size + n]
        at += _FRAME.size + n


class Channel:
    """One direction of typed messages. `recv(timeout_s)`: the next message, waiting up to
    `timeout_s` (0: only one already there), None when none came; `recv_all`: every message there.
    `sent_at`: when this process last sent on it (`time.monotonic`; -inf: never) — a member's
    reports count as its heartbeat (`liveness.HeartbeatThread`)."""

    def __init__(self, queue) -> None:
        self.queue, self.sent_at = queue, float("-inf")

    def __getstate__(self):
        return self.queue

    def __setstate__(self, queue) -> None:
        self.__init__(queue)

    def send(self, msg) -> None:
        self.queue.put(encode(msg))
        self.sent_at = time.monotonic()

    def recv_all(self, timeout_s: float = 0.0) -> list:
        """Every message there, waiting up to `timeout_s` for the first: of a `StoreLog`, those of
        its one read (no second round trip to find it empty), else until the queue is empty."""
        msg = self.recv(timeout_s)
        if msg is None:
            return []
        if isinstance(self.queue, StoreLog):
            out = [msg, *map(decode, self.queue.taken)]
            self.queue.taken.clear()
            return out
        out = []
        while msg is not None:
            out.append(msg)
            msg = self.recv()
        return out

    def recv(self, timeout_s: float = 0.0):
        try:
            data = self.queue.get(timeout=timeout_s) if timeout_s > 0 else self.queue.get_nowait()
        except queue_mod.Empty:
            return None
        return decode(data)


class Transport:
    """Makes the channels of a job whose store listens at (`host`, `port`)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port

    def channel(self, key: str) -> Channel:
        return Channel(StoreQueue(self.host, self.port, key))

    def inbox(self) -> Channel:
        """The controller's inbox (a `StoreLog`: the controller takes many messages per read)."""
        return Channel(StoreLog(self.host, self.port, INBOX))

    def commands(self, node: int) -> Channel:
        return self.channel(commands_key(node))

    def beats(self, node: int) -> Channel:
        return self.channel(beats_key(node))

    def fence(self, node: int) -> None:
        """Fence `node`: its fence counter moves on (`fences`); its agent, seeing it, kills its members."""
        self._counter(fence_key(node), 1)

    def fences(self, node: int) -> int:
        """How often `node` was fenced so far (an agent notes it when it starts)."""
        return self._counter(fence_key(node), 0)

    def value(self, key: str) -> bytes | None:
        """The value under `key`, None while there is none (without waiting)."""
        if not _store_op(self.host, self.port, "check", [key]):
            return None
        return _store_op(self.host, self.port, "get", key)

    def _counter(self, key: str, by: int) -> int:
        return _store_op(self.host, self.port, "add", key, by)

    def close(self) -> None:
        """This process is done with the store (its client is dropped; a later call reconnects)."""
        _drop(self.host, self.port)
