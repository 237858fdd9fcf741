"""Liveness of the elastic runtime without processes: the helpers of `liveness.py` (who is hung,
the inbox, the heartbeat thread, the listening clock, the join barrier), the node agents'
bookkeeping (`agent.Agents`) and `faults.join_stop`. The same in whole jobs: test_liveness_jobs.py.
"""

import queue
import time

import pytest

from resihp.core.faults import FaultSpec
from resihp.runtime.adapt.recovery import source_generation
from resihp.runtime.config import TrainConfig
from resihp.runtime.control.agent import Agents
from resihp.runtime.control.liveness import HeartbeatThread, JoinBarrier, ListeningClock, Liveness
from resihp.runtime.control.processes import Processes
from resihp.runtime.control.protocol import (
    FROM_MEMBER,
    AgentBeat,
    Done,
    Exited,
    Gate,
    Reached,
    Spawned,
    encode,
)
from resihp.runtime.control.transport import Channel
from resihp.runtime.faults import join_stop


# ---------------------------------------------------------------------------------- no processes
def test_liveness_names_hung_and_unstarted_members():
    """Silence counts from the last beat, a missing first beat from the spawn; forgotten members and
    their late beats are ignored."""
    live = Liveness(timeout_s=2.0, start_timeout_s=10.0)
    for d in (0, 1, 2):
        live.spawn(d, 0.0)
    live.beat(0, 1.0)
    live.beat(1, 1.0)
    live.beat(1, 2.5)
    assert live.hung(3.5) == [0] and live.hung(2.9) == []
    assert live.unstarted(9.0) == [] and live.unstarted(10.5) == [2]
    live.forget(0)
    live.beat(0, 4.0)  # a dead member's last beat, read late
    assert live.hung(100.0) == [1] and 0 not in live.last
    live.spawn(1, 50.0)  # a fresh process for the device: its start timeout counts again
    assert live.hung(51.0) == [] and live.unstarted(61.0) == [1, 2]


def _processes(members: Liveness, clock: float) -> tuple[Processes, queue.Queue, list]:
    """A controller's Processes on an in-process channel (no processes); the member messages it
    dispatches land in the returned list."""
    q, seen = queue.Queue(), []
    handlers = {kind: seen.append for kind in FROM_MEMBER}
    procs = Processes(None, Channel(q), members, 2, 2.0, 10.0, handlers, clock=lambda: clock)
    return procs, q, seen


def test_inbox_takes_every_arrived_message_and_applies_agent_reports_first():
    """One get drains the channel: agents' beats update the Liveness (even those queued behind
    member messages), the member messages come out one by one in order, and dispatch hands each to
    its handler."""
    members = Liveness()
    members.spawn(0, 0.0)
    members.spawn(1, 0.0)
    procs, q, seen = _processes(members, 7.0)
    procs.agents.liveness.spawn(0, 0.0)
    for msg in [AgentBeat(0, 3.0, {0: 3.0}), Reached(1, 0, 3, (), 0.1), AgentBeat(0, 5.0, {1: 5.0}), Done(0)]:
        q.put(encode(msg))
    assert procs.inbox.get(0.01) == Reached(1, 0, 3, (), 0.1)
    assert members.last == {0: 7.0, 1: 7.0} and q.empty()
    procs.dispatch(procs.inbox.get(0.01))
    assert seen == [Done(0)] and procs.inbox.get(0.01) is None


def test_inbox_dates_forwarded_beats_by_their_age_and_applies_process_reports():
    """An agent's report beats its node and each device as of `now - age` (agent clock: no offset
    between the machines matters); spawn and exit reports update the process table at once, and an
    exit of a device's former process is ignored."""
    members = Liveness(timeout_s=2.0)
    procs, q, _ = _processes(members, 10.0)
    agents, nodes = procs.agents, procs.agents.liveness
    for d in (2, 3):
        members.spawn(d, 0.0)
        agents.code[d] = None
    nodes.spawn(1, 0.0)
    q.put(encode(Spawned(2, 41, 1)))
    q.put(encode(AgentBeat(1, 500.0, {2: 499.5, 3: 497.0})))  # device 3 silent for 3 s
    q.put(encode(Exited(2, 1, 1, 40)))  # its former process
    q.put(encode(Reached(2, 0, 0, (), 0.1)))
    assert procs.inbox.get(0.01) == Reached(2, 0, 0, (), 0.1)
    assert members.last == {2: 10.0, 3: 7.0} and nodes.last == {1: 10.0}  # (2: its `Reached`, now)
    assert members.hung(10.0) == [3] and nodes.hung(10.0) == []
    assert agents.pid == {2: 41} and agents.exitcode(2) is None and agents.pids == [41]
    q.put(encode(Exited(2, -9, 1, 41)))
    procs.inbox.drain()
    assert agents.exitcode(2) == -9 and agents.node_of(3) == 1 and agents.node_of(1) == 0


def test_a_member_message_is_a_beat_and_one_read_serves_many_gets():
    """Each member message beats its device on arrival, and an older forwarded beat read after it
    does not move it back; the messages of one read are handed out without reading again (within
    `Inbox.FRESH_S`); with none left the next get reads."""
    members = Liveness()
    members.spawn(0, 0.0)
    members.spawn(1, 0.0)
    procs, q, _ = _processes(members, 8.0)
    reads = []
    get_nowait = q.get_nowait
    q.get_nowait = lambda: reads.append(1) or get_nowait()
    for msg in [Reached(0, 0, 3, (), 0.1), AgentBeat(0, 5.0, {0: 2.0, 1: 4.0}), Reached(1, 0, 3, (), 0.1)]:
        q.put(encode(msg))
    procs.agents.liveness.spawn(0, 0.0)
    assert procs.inbox.get(0.01) == Reached(0, 0, 3, (), 0.1)
    assert members.last == {0: 8.0, 1: 8.0} and len(reads) == 3  # (after a `get`): two, then empty
    assert procs.inbox.get(0.01) == Reached(1, 0, 3, (), 0.1) and len(reads) == 3
    assert procs.inbox.get(0.0) is None and len(reads) == 4
    members.beat(0, 6.0)
    assert members.last[0] == 8.0


def test_a_reporting_member_sends_no_heartbeats_and_a_quiet_one_does():
    """`HeartbeatThread` stays quiet while the member's reports go out (each is a beat at the
    controller) and beats once they stop."""
    beats, reports = Channel(queue.Queue()), Channel(queue.Queue())
    reports.send(Done(0))
    heart = HeartbeatThread(0, beats, period_s=0.2, reports=reports)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        reports.send(Done(0))
        time.sleep(0.01)
    quiet = beats.queue.qsize()
    time.sleep(1.0)
    heart.stop()
    assert quiet <= 1 and beats.queue.qsize() - quiet >= 2, (quiet, beats.queue.qsize())


class _Proc:  # an agent process that is alive but says nothing (SIGSTOPped, or a lost machine)
    exitcode, killed = None, False

    def kill(self):
        self.killed = True

    def join(self, timeout=None):
        pass


class _Store:  # the channels a transport names, kept in memory; `emptied`: the keys of those deleted
    def __init__(self):
        self.emptied = []

    def channel(self, key):
        store = self

        class Emptied(queue.Queue):  # a node's channel queue in the store: emptied when its node is lost
            def delete(self):
                store.emptied.append(key)

        return Channel(Emptied())

    def commands(self, node):
        return self.channel(("commands", node))

    def beats(self, node):
        return self.channel(("beats", node))


def test_a_silent_agent_loses_its_node_and_every_running_device_of_it():
    """An agent silent for the heartbeat timeout is killed and its node's devices still running are
    fenced (exit code -SIGKILL), its channels emptied; finished devices and other nodes stay as
    they are."""
    store = _Store()
    agents = Agents(store, 2, timeout_s=2.0, start_timeout_s=10.0)
    procs = {0: _Proc(), 1: _Proc()}
    for node, proc in procs.items():
        agents.procs[node] = proc
        agents.liveness.spawn(node, 0.0)
    agents.code = {0: None, 1: None, 2: None, 3: 0}  # device 3 finished
    agents.liveness.beat(0, 9.0)
    agents.liveness.beat(1, 7.5)
    assert agents.lost(9.0) == {}
    assert agents.lost(10.0) == {1: [2]} and procs[1].killed and not procs[0].killed
    assert agents.code == {0: None, 1: None, 2: -9, 3: 0} and set(agents.procs) == {0}
    assert store.emptied == [("commands", 1), ("beats", 1)]  # a fresh agent of node 1 reads nothing stale
    assert agents.lost(10.5) == {} and agents.unstarted(100.0) == []


def test_the_listening_clock_leaves_the_controllers_own_pauses_out():
    """Gaps up to `gap_s` between readings count whole, a longer one (the controller paused) as
    `gap_s`; the clock reads as the raw one until the first such gap."""
    raw = [10.0]
    clock = ListeningClock(lambda: raw[0], gap_s=0.5)
    readings = []
    for t in (10.0, 10.3, 10.7, 15.7, 15.8, 16.3):
        raw[0] = t
        readings.append(clock())
    assert readings == pytest.approx([10.0, 10.3, 10.7, 11.2, 11.3, 11.8])


def test_a_pause_of_the_controller_with_its_agent_fences_nothing_a_silence_it_hears_does():
    """Issue 17's fence at start-up, deterministic: the agent of node 0 and the controller stop
    together for 5 s (a loaded machine; the heartbeat timeout is 2 s); when the controller turns
    again, before the agent's next beat is in, nothing is fenced — the 5 s were heard as
    `LISTEN_GAP_S` — and the beat comes. Silent while the controller turns every 0.1 s, the agent
    is fenced after 2 s of listening, its devices with it."""
    raw, q, members, agent = [0.0], queue.Queue(), Liveness(timeout_s=2.0), _Proc()
    handlers = {kind: print for kind in FROM_MEMBER}
    procs = Processes(None, Channel(q), members, None, 2.0, 10.0, handlers, clock=lambda: raw[0])
    agents = procs.agents
    agents.transport, agents.procs = _Store(), {0: agent}
    agents.liveness.spawn(0, procs.clock())
    for d in (0, 1):
        members.spawn(d, procs.clock())
        agents.code[d] = None

    def turn(t: float, beat: bool = False) -> None:
        raw[0] = t
        if beat:
            q.put(encode(AgentBeat(0, 100.0 + t, {0: 100.0 + t, 1: 100.0 + t})))
        procs.inbox.get(0.0)
        procs.check_alive({0, 1})

    for k in range(21):  # the agent beats every 0.25 s, the controller turns every 0.1 s
        turn(k * 0.1, beat=k % 2 == 0)
    turn(7.0)  # both stopped from 2.0 to 7.0: no beat in yet
    assert not agent.killed and procs.killed == {}
    turn(7.1, beat=True)
    t = 7.1
    while not procs.killed:  # the agent goes silent for good
        t += 0.1
        turn(t)
        assert t < 10.0
    assert t == pytest.approx(9.2) and agent.killed and procs.killed == {0: "node", 1: "node"}


def test_join_barrier_goes_once_everyone_arrived_and_aborts_superseded_generations():
    barrier = JoinBarrier()
    barrier.open(1, [0, 2, 3])
    barrier.arrive(1, 0)
    barrier.arrive(1, 2)
    assert not barrier.ready(1)
    barrier.open(2, [0, 2])  # device 3 died before arriving: generation 2 supersedes 1
    assert barrier.supersede(2) == [1] and barrier.verdict[1] is Gate.ABORT
    barrier.arrive(1, 3)
    assert not barrier.ready(1)  # a verdict is final
    barrier.arrive(2, 2)
    barrier.arrive(2, 0)
    assert barrier.ready(2)
    barrier.decide(2, Gate.GO)
    assert not barrier.ready(2) and barrier.supersede(3) == []


def test_source_generation_is_the_last_one_every_surviving_plan_device_joined():
    """Generation 1's rebuild failed (device 0 died, device 2 never finished its join): the
    survivors transfer from generation 0; a standby member (4) need not have joined."""
    plans = [(0, 1, 2, 3), (0, 2, 3), (2, 3)]
    joined = {0: {0, 1, 2, 3}, 1: {3}}
    assert source_generation(plans, joined, {2, 3, 4}) == 0
    assert source_generation(plans, {**joined, 1: {2, 3}}, {2, 3, 4}) == 1
    assert source_generation(plans, {**joined, 2: {2, 3}}, {2, 3}) == 2
    assert source_generation(plans, {}, {0, 1}) is None  # nothing joined yet: seed / checkpoint
    assert source_generation([(0, 1), (2, 3)], {0: {0, 1}}, {0, 1}) == 0  # no live device of 1


def test_join_stop_hits_the_first_join_at_or_after_its_iteration_once_per_life():
    faults = (
        FaultSpec("stop", at_iter=2, device=0, phase="join"),
        FaultSpec("stop", at_iter=2, device=1),
        FaultSpec("rejoin", at_iter=5, device=0),
    )
    assert join_stop(faults, 0, 1) is None
    assert join_stop(faults, 0, 2) is faults[0] and join_stop(faults, 0, 4) is faults[0]
    assert join_stop(faults, 0, 5) is None  # the re-joined process
    assert join_stop(faults, 1, 3) is None  # a stop at the start of an iteration


@pytest.mark.parametrize("value", [0.5, 61, "2", True])
def test_heartbeat_timeout_is_validated(value):
    with pytest.raises(ValueError, match=r"run\.heartbeat_timeout_s = .*\[1, 60\]"):
        TrainConfig.from_dict({"run": {"heartbeat_timeout_s": value}})
    assert TrainConfig.from_dict({"run": {"heartbeat_timeout_s": 5}}).heartbeat_timeout_s == 5
