import heapq

import pytest

from resihp.detect.heartbeat import (
    C10dStore,
    Coordinator,
    DictStore,
    HeartbeatConfig,
    NodeMonitor,
    WorkerHeartbeat,
)


class ManualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _simulate(cfg, *, silent_at=None, node_silent_at=None, until=30.0, phases=(0.0, 0.3, 0.6)):
    """Two nodes x two workers; returns first-death times seen by monitors and coordinator."""
    clock, store = ManualClock(), DictStore()
    nodes = {0: (0, 1), 1: (2, 3)}
    workers = {d: WorkerHeartbeat(store, d, clock, cfg) for ds in nodes.values() for d in ds}
    monitors = {n: NodeMonitor(store, n, ds, clock, cfg) for n, ds in nodes.items()}
    coord = Coordinator(store, nodes, clock, cfg)
    w_phase, m_phase, c_phase = phases
    events = [(w_phase, 0, "w"), (m_phase, 1, "m"), (c_phase, 2, "c")]
    heapq.heapify(events)
    monitor_dead, coord_dead = {}, {}
    progress = 0
    while events:
        t, order, kind = heapq.heappop(events)
        if t > until:
            break
        clock.now = t
        if kind == "w":
            progress += 1
            for d, w in workers.items():
                node = 0 if d < 2 else 1
                if (silent_at or {}).get(d, 1e9) <= t or (node_silent_at or {}).get(node, 1e9) <= t:
                    continue
                w.beat(progress)
            heapq.heappush(events, (t + cfg.period_s, order, kind))
        elif kind == "m":
            for n, m in monitors.items():
                if (node_silent_at or {}).get(n, 1e9) <= t:
                    continue
                for d in m.poll():
                    monitor_dead.setdefault(d, t)
            heapq.heappush(events, (t + cfg.period_s, order, kind))
        else:
            for r in coord.poll():
                assert r.kind == "fail-stop" and r.severity == 0.0
                coord_dead.setdefault(r.devices[0], (t, r.iteration))
            heapq.heappush(events, (t + cfg.node_period_s, order, kind))
    return monitor_dead, coord_dead, coord


@pytest.mark.parametrize("misses", [1, 2, 3, 5])
@pytest.mark.parametrize("phases", [(0.0, 0.0, 0.0), (0.0, 0.3, 0.6), (0.7, 0.2, 0.9), (0.5, 0.49, 0.5)])
def test_silent_worker_dead_within_period_times_misses_plus_one(misses, phases):
    """A worker silent after its last beat t0 is declared dead in (t0 + P·M, t0 + P·(M + 1)]."""
    cfg = HeartbeatConfig(period_s=1.0, misses=misses)
    stop = 10.0 + phases[0] + 0.01  # the worker's last beat was at t0 = 10 + phase
    t0 = 10.0 + phases[0]
    monitor_dead, coord_dead, _ = _simulate(cfg, silent_at={1: stop}, phases=phases)
    assert set(monitor_dead) == {1}
    assert t0 + misses < monitor_dead[1] <= t0 + misses + 1.0 + 1e-9
    t_c, progress = coord_dead[1]
    assert monitor_dead[1] <= t_c <= monitor_dead[1] + 1.0  # the coordinator sees it next poll
    assert progress == 11  # the last progress the worker reported


def test_live_workers_never_declared_dead():
    """With every worker beating each period, nothing is declared dead over 100 periods."""
    for misses in (1, 3):
        monitor_dead, coord_dead, _ = _simulate(HeartbeatConfig(misses=misses), until=100.0)
        assert monitor_dead == {} and coord_dead == {}


@pytest.mark.parametrize("phases", [(0.0, 0.3, 0.6), (0.0, 0.9, 0.1)])
def test_silent_node_takes_all_its_devices(phases):
    """A node whose monitor stops is dead with both devices in (t0 + P·M, t0 + P·(M + 2)]."""
    cfg = HeartbeatConfig(node_period_s=1.0, node_misses=3)
    stop = 10.0 + phases[1] + 0.01
    t0 = 10.0 + phases[1]  # the monitor's last publish
    _, coord_dead, coord = _simulate(cfg, node_silent_at={1: stop}, phases=phases)
    assert set(coord_dead) == {2, 3} and coord.dead_nodes == {1}
    assert t0 + 3 < coord_dead[2][0] <= t0 + 5 + 1e-9


def test_rejoined_worker_leaves_the_dead_set():
    """A worker that beats again after being declared dead is reported once by poll_rejoined."""
    clock, store = ManualClock(), DictStore()
    cfg = HeartbeatConfig(misses=2)
    w, m = WorkerHeartbeat(store, 0, clock, cfg), NodeMonitor(store, 0, (0,), clock, cfg)
    coord = Coordinator(store, {0: (0,)}, clock, cfg)
    w.beat(1)
    clock.now = 3.0
    assert m.poll() == [0] and [r.devices for r in coord.poll()] == [(0,)]
    w.beat(2)
    m.poll()
    assert coord.poll() == [] and coord.poll_rejoined() == [0] and coord.poll_rejoined() == []


def test_bad_config():
    """Non-positive periods and miss counts are rejected with the key named."""
    with pytest.raises(ValueError, match="heartbeat.period_s"):
        HeartbeatConfig(period_s=0)
    with pytest.raises(ValueError, match="heartbeat.misses"):
        HeartbeatConfig(misses=0)


def test_c10d_adapter_checks_before_get():
    """C10dStore returns None for a missing key without calling the blocking get."""

    class FakeTCPStore:
        def __init__(self):
            self.data, self.gets = {}, 0

        def set(self, key, value):
            self.data[key] = value

        def check(self, keys):
            return all(k in self.data for k in keys)

        def get(self, key):
            self.gets += 1
            return self.data[key]

    raw = FakeTCPStore()
    store = C10dStore(raw)
    assert store.get("hb/w/0") is None and raw.gets == 0
    store.set("hb/w/0", b"x")
    assert store.get("hb/w/0") == b"x"
