"""A node's decisions, read once: its agent fetches each `decision/{g}/{k}` for all its members.

At STEP every member blocks on the controller's decision (`board.Board.decision`). Read by each
member from the store, one commit costs the store's single server thread a blocking get per member
(a wait and a get on the wire, and a reply to each): at 256 members, half of the store's requests
per commit (docs/benchmarks.md, "Control plane"). Instead, a member asks its node's agent
(`Relayed.decision`), over a pipe the agent made for it at spawn (`DecisionRelay.connect`); the
agent reads each decision from the store once, whichever of its members asks first, and answers
every member that asked, and those that ask later, from the bytes it read (the last `KEEP`
decisions).

The pipe never leaves the node — an agent and its own children — and carries only the store's
bytes (what `protocol.Decision.encode` wrote): the controller still writes each decision once,
to the store, and nothing else carries what it says (docs/runtime.md, "Decisions").

A relay that cannot read a decision (the store's timeout, `protocol.PG_TIMEOUT_S`, or the store
gone) answers empty bytes, and the member raises, as a member raises on its own store read's
timeout; a member whose agent is gone raises too (and its agent's death ends it anyway:
`pids.watch`). Torch-free at import: the fetch threads import the store client.
"""

from __future__ import annotations

import queue
import selectors
import struct
import threading
from collections import OrderedDict
from datetime import timedelta
from multiprocessing.connection import Connection, Pipe

from .protocol import Decision, decision_key, read_decision

ASK = struct.Struct("<qq")  # a member's question: (generation, iteration)
KEEP = 16  # decisions an agent keeps for members that ask late
FETCHERS = 4  # store reads in flight at once (one per generation, but for a generation change)


class DecisionRelay:
    """The agent's side: one serving thread waits on every member's pipe and answers, `FETCHERS`
    threads read the store (each its own blocking client of the store at `host`:`port`)."""

    def __init__(self, host: str, port: int, timeout_s: float) -> None:
        self.host, self.port, self.timeout = host, port, timedelta(seconds=timeout_s)
        self.lock = threading.Lock()
        self.conns: list[Connection] = []  # the agent's ends, one per member (closed by `_serve` alone)
        self.fresh: list[Connection] = []  # connected, not yet watched by `_serve`
        self.known: OrderedDict[tuple[int, int], bytes] = OrderedDict()  # the last KEEP decisions read
        self.waiting: dict[tuple[int, int], list[Connection]] = {}  # decisions being read -> askers
        self.keys: queue.Queue = queue.Queue()  # decisions to read (None: stop)
        self.wake_r, self.wake_w = Pipe(duplex=False)  # `connect` and `close` wake the serving thread
        self.stopped = False
        self.threads = [threading.Thread(target=self._serve, name="relay-serve", daemon=True)]
        self.threads += [
            threading.Thread(target=self._fetch, name=f"relay-{i}", daemon=True) for i in range(FETCHERS)
        ]  # (daemons: a read blocked on a dead store never holds the agent's exit)
        for t in self.threads:
            t.start()

    def connect(self) -> Connection:
        """A new member's end of its pipe (hand it to the member's process, then close it here)."""
        mine, theirs = Pipe()
        with self.lock:
            self.conns.append(mine)
            self.fresh.append(mine)
        self.wake_w.send_bytes(b"")
        return theirs

    def close(self) -> None:
        self.stopped = True
        for _ in range(FETCHERS):
            self.keys.put(None)
        self.wake_w.send_bytes(b"")
        self.threads[0].join(5.0)

    def _serve(self) -> None:
        watch = selectors.DefaultSelector()  # (one for the relay's life: its members come and go)
        watch.register(self.wake_r, selectors.EVENT_READ)
        while not self.stopped:
            for key, _ in watch.select():
                conn = key.fileobj
                if conn is self.wake_r:
                    conn.recv_bytes()
                    with self.lock:
                        fresh, self.fresh = self.fresh, []
                    for c in fresh:
                        watch.register(c, selectors.EVENT_READ)
                    continue
                try:
                    ask = ASK.unpack(conn.recv_bytes())
                except (EOFError, OSError):  # the member exited
                    watch.unregister(conn)
                    with self.lock:  # (answers are sent under the lock: none goes to a closed pipe)
                        self.conns.remove(conn)
                        for askers in self.waiting.values():
                            if conn in askers:
                                askers.remove(conn)
                        conn.close()
                    continue
                self._ask(ask, conn)
        watch.close()
        with self.lock:
            for conn in self.conns:
                conn.close()
            self.conns.clear()

    def _ask(self, key: tuple[int, int], conn: Connection) -> None:
        with self.lock:
            value = self.known.get(key)
            first = value is None and key not in self.waiting
            if value is not None:
                _answer(conn, value)
            else:
                self.waiting.setdefault(key, []).append(conn)
        if first:
            self.keys.put(key)

    def _fetch(self) -> None:
        store = None
        while (key := self.keys.get()) is not None:
            try:
                store = store or self.client()
                value = store.get(decision_key(*key))
            except RuntimeError:  # (DistStoreError) the store's timeout, or the store is gone
                value, store = b"", None
            with self.lock:
                if value:
                    self.known[key] = value
                    while len(self.known) > KEEP:
                        self.known.popitem(last=False)
                for conn in self.waiting.pop(key, []):
                    _answer(conn, value)

    def client(self):
        """A fetch thread's own blocking client of the store."""
        import torch.distributed as dist

        return dist.TCPStore(
            self.host, self.port, is_master=False, timeout=self.timeout, wait_for_workers=False
        )


def _answer(conn: Connection, value: bytes) -> None:
    try:
        conn.send_bytes(value)
    except OSError:  # the member exited: `_serve` sees its pipe's end and drops it
        pass


class Relayed:
    """A member's side: `decision(g, k)`, as `board.Board.decision`, through its agent's relay."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def decision(self, generation: int, it: int) -> Decision:
        try:
            self.conn.send_bytes(ASK.pack(generation, it))
            value = self.conn.recv_bytes()
        except (EOFError, OSError):
            raise RuntimeError(f"decision/{generation}/{it}: the node agent is gone") from None
        if not value:
            raise RuntimeError(f"decision/{generation}/{it}: the node agent could not read it from the store")
        return read_decision(value)
