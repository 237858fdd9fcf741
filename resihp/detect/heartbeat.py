"""Two-level fail-stop detection: worker heartbeats → node monitors → central coordinator.

- A worker `beat(progress)`s every `period_s` into the store under `{prefix}/w/{device}`, with a
  sequence number, its training progress and its own clock reading.
- A node's `NodeMonitor.poll()` runs every `period_s` on the same node (same clock as its workers)
  and declares a worker dead when `now − last beat > period_s × misses`. A worker silent from t0 is
  therefore declared dead at the first poll after t0 + period_s × misses: never before, and no later
  than t0 + period_s × (misses + 1). A worker that never beat counts from the monitor's start.
  Each poll publishes the node's beat `{prefix}/n/{node}` (sequence, dead devices, progress).
- The `Coordinator` watches only node beats (cost scales with nodes). Clocks of different nodes
  are not compared: a node is dead when its beat sequence has not changed for more than
  `node_period_s × node_misses` of the coordinator's own clock — declared no later than
  t0 + node_period_s × (node_misses + 2) when polled every node_period_s. A dead node takes all
  its devices with it. New deaths come out as `FailureReport(kind="fail-stop")`; a device whose
  worker beats again leaves the dead set and is listed once in `poll_rejoined()`.

The store needs two methods, `set(key: str, value: bytes)` and `get(key: str) -> bytes | None`.
`DictStore` is the in-process one; `C10dStore` wraps a c10d TCPStore (whose `get` blocks on a
missing key, so the wrapper checks `store.check([key])` first). The clock is any callable returning
seconds (`time.monotonic` in production, a manual clock in tests).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from .report import FailureReport

Clock = Callable[[], float]


class Store(Protocol):
    def set(self, key: str, value: bytes) -> None: ...

    def get(self, key: str) -> bytes | None: ...


class DictStore:
    """Thread-safe in-process store."""

    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def set(self, key: str, value: bytes) -> None:
        with self._lock:
            self._data[key] = bytes(value)

    def get(self, key: str) -> bytes | None:
        with self._lock:
            return self._data.get(key)


class C10dStore:
    """Adapter for a c10d store (TCPStore, PrefixStore): its `get` blocks on a missing key, so
    `check` first. Duck-typed: no torch import here."""

    def __init__(self, store) -> None:
        self._store = store

    def set(self, key: str, value: bytes) -> None:
        self._store.set(key, value)

    def get(self, key: str) -> bytes | None:
        return self._store.get(key) if self._store.check([key]) else None


@dataclass(frozen=True)
class HeartbeatConfig:
    period_s: float = 1.0
    misses: int = 3
    node_period_s: float = 1.0
    node_misses: int = 3
    prefix: str = "hb"

    def __post_init__(self) -> None:
        for name in ("period_s", "node_period_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"heartbeat.{name} = {getattr(self, name)!r}: must be > 0")
        for name in ("misses", "node_misses"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"heartbeat.{name} = {v!r}: must be an integer >= 1")


def _load(raw: bytes | None) -> dict | None:
    return None if raw is None else json.loads(raw.decode())


class WorkerHeartbeat:
    """The worker side: call `beat(progress)` about every `period_s`."""

    def __init__(self, store: Store, device: int, clock: Clock, config: HeartbeatConfig | None = None):
        self.store, self.device, self.clock = store, device, clock
        self.config = config or HeartbeatConfig()
        self._seq = 0

    def beat(self, progress: int) -> None:
        self._seq += 1
        msg = {"seq": self._seq, "progress": int(progress), "t": float(self.clock())}
        self.store.set(f"{self.config.prefix}/w/{self.device}", json.dumps(msg).encode())


class NodeMonitor:
    """Node-local monitor of `devices`; `poll()` about every `period_s`, returns newly dead ones."""

    def __init__(
        self,
        store: Store,
        node: int,
        devices: Sequence[int],
        clock: Clock,
        config: HeartbeatConfig | None = None,
    ):
        self.store, self.node, self.devices, self.clock = store, node, tuple(devices), clock
        self.config = config or HeartbeatConfig()
        self._start = clock()
        self._seq = 0
        self.dead: set[int] = set()
        self.progress: dict[int, int] = {}

    def poll(self) -> list[int]:
        now = self.clock()
        c = self.config
        newly = []
        for d in self.devices:
            msg = _load(self.store.get(f"{c.prefix}/w/{d}"))
            last = self._start
            if msg is not None:
                last = min(float(msg["t"]), now)
                self.progress[d] = int(msg["progress"])
            if now - last > c.period_s * c.misses:
                if d not in self.dead:
                    self.dead.add(d)
                    newly.append(d)
            else:
                self.dead.discard(d)
        self._seq += 1
        beat = {
            "seq": self._seq,
            "dead": sorted(self.dead),
            "progress": {str(d): p for d, p in self.progress.items()},
        }
        self.store.set(f"{c.prefix}/n/{self.node}", json.dumps(beat).encode())
        return newly


class Coordinator:
    """Central coordinator: `poll()` about every `node_period_s`; returns new fail-stop reports."""

    def __init__(
        self,
        store: Store,
        nodes: Mapping[int, Sequence[int]],
        clock: Clock,
        config: HeartbeatConfig | None = None,
    ):
        self.store, self.clock = store, clock
        self.nodes = {n: tuple(ds) for n, ds in nodes.items()}
        self.config = config or HeartbeatConfig()
        start = clock()
        self._seen: dict[int, tuple[int, float]] = {n: (-1, start) for n in self.nodes}
        self._dead_by_monitor: dict[int, set[int]] = {n: set() for n in self.nodes}
        self.progress: dict[int, int] = {}
        self.dead_nodes: set[int] = set()
        self._reported: set[int] = set()
        self._rejoined: list[int] = []

    @property
    def dead_devices(self) -> set[int]:
        out = set().union(*self._dead_by_monitor.values()) if self._dead_by_monitor else set()
        for n in self.dead_nodes:
            out |= set(self.nodes[n])
        return out

    def poll(self) -> list[FailureReport]:
        now = self.clock()
        c = self.config
        for n in self.nodes:
            msg = _load(self.store.get(f"{c.prefix}/n/{n}"))
            seq, seen_at = self._seen[n]
            if msg is not None and int(msg["seq"]) != seq:
                self._seen[n] = (int(msg["seq"]), now)
                self._dead_by_monitor[n] = {int(d) for d in msg["dead"]}
                self.progress.update({int(d): int(p) for d, p in msg["progress"].items()})
                self.dead_nodes.discard(n)
            elif now - seen_at > c.node_period_s * c.node_misses:
                self.dead_nodes.add(n)
        dead = self.dead_devices
        for d in sorted(self._reported - dead):
            self._reported.discard(d)
            self._rejoined.append(d)
        reports = [
            FailureReport("fail-stop", (d,), severity=0.0, confidence=1.0, iteration=self.progress.get(d, -1))
            for d in sorted(dead - self._reported)
        ]
        self._reported |= dead
        return reports

    def poll_rejoined(self) -> list[int]:
        """Devices that came back since the last call (each listed once)."""
        out, self._rejoined = self._rejoined, []
        return out
