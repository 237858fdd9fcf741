"""The store transport (`control/transport.py`) and an agent's fencing when its controller is gone.

The channels are queues of a real `TCPStore`; the fencing test runs the store and an agent as
separate OS processes, as `resihp agent` on another host would be.
"""

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch.distributed as dist

from resihp.core.model_spec import model_preset
from resihp.core.plan import Plan
from resihp.runtime.config import TrainConfig
from resihp.runtime.control.agent import FENCED_EXIT, Reach
from resihp.runtime.control.pids import running
from resihp.runtime.control.protocol import AgentBeat, Generation, Joining, Kind, MemberArgs, Record, Spawn
from resihp.runtime.control.transport import Transport, Unreachable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _send_from_a_child(channel, n: int) -> None:
    for i in range(n):
        channel.send(Joining(i, 0))


def test_store_channels_keep_order_cross_processes_and_say_when_the_store_is_gone():
    """Messages of one sender arrive in order, also from another process (the channel pickles as
    its address); two senders' messages all arrive once; `recv` waits up to its timeout and says
    None; a channel whose store is gone raises `Unreachable` (an OSError) instead of hanging."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    transport = Transport("127.0.0.1", store.port)
    inbox = transport.inbox()
    assert inbox.recv() is None
    t0 = time.perf_counter()
    assert inbox.recv(0.2) is None and 0.2 <= time.perf_counter() - t0 < 1.0
    child = mp.get_context("spawn").Process(target=_send_from_a_child, args=(inbox, 50))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert [inbox.recv(5.0) for _ in range(50)] == [Joining(i, 0) for i in range(50)]
    other = transport.commands(3)
    threads = [
        threading.Thread(target=lambda k=k: [other.send(Record(k, 0, i, b"{}")) for i in range(200)])
        for k in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = [other.recv(1.0) for _ in range(400)]
    assert sorted((m.device, m.iter) for m in got) == [(k, i) for k in range(2) for i in range(200)]
    assert [m.iter for m in got if m.device == 1] == list(range(200))
    assert other.recv() is None and inbox.recv() is None
    del store  # the controller is gone
    with pytest.raises(Unreachable):
        inbox.recv()
    with pytest.raises(OSError):
        inbox.recv(0.1)
    transport.close()


def test_reach_is_lost_only_after_the_timeout_since_the_first_failure():
    reach = Reach(0.2)
    assert not reach.lost()
    time.sleep(0.1)
    reach.ok()  # a call got through: the next failure starts the count again
    assert not reach.lost()
    time.sleep(0.25)
    assert reach.lost()


STORE = (  # the controller's store, as `resihp controller` makes it (its run facts published)
    "import time\n"
    "from resihp.runtime.control.hosting import Hosting\n"
    "s = Hosting(listen=('127.0.0.1', 0), controller_timeout_s=1.0).store()\n"
    "print(s.port, flush=True)\n"
    "time.sleep(600)\n"
)


@pytest.mark.slow
def test_an_agent_cut_off_from_its_controller_kills_its_member_and_gives_up_after_its_wait():
    """A store (the controller's host) and `resihp agent --node-rank 1 --wait-s 1` as separate OS
    processes. The agent spawns a member on the store's command, reports it and forwards its
    heartbeats; once the store's process is SIGKILLed, the agent kills the member within
    `controller_timeout_s` (1 s) + 2 s, saying so in one line, waits 1 s for a new controller
    there, and exits `FENCED_EXIT` with one more line; nothing is left running."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    host = subprocess.Popen([sys.executable, "-c", STORE], stdout=subprocess.PIPE, text=True, env=env)
    agent = None
    try:
        port = int(host.stdout.readline())
        transport = Transport("127.0.0.1", port)
        agent = subprocess.Popen(
            [sys.executable, "-m", "resihp.cli.main", "agent", "--controller", f"127.0.0.1:{port}",
             "--node-rank", "1", "--wait-s", "1"],
            stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        config = TrainConfig(tp=1, pp=1, dp=1, workers=1, seq_len=32, iterations=2)
        plan = Plan.uniform(model_preset("tiny"), 1, 1, 1, 1)
        body = Generation(0, plan, (2,), 0, None, ())  # device 2: node 1's (never let through `go`)
        transport.commands(1).send(Spawn(2, MemberArgs(body, config.job_spec(plan), 2, port).encode()))
        inbox, pid, beating = transport.inbox(), None, False
        deadline = time.monotonic() + 120
        while not (pid and beating) and time.monotonic() < deadline:
            msg = inbox.recv(1.0)
            if msg is not None and msg.kind is Kind.SPAWNED:
                pid = msg.pid
            beating |= isinstance(msg, AgentBeat) and 2 in msg.beats
        assert pid and beating and running(pid)
        transport.close()
        host.send_signal(signal.SIGKILL)
        t0 = time.monotonic()
        fenced = agent.stderr.readline()
        while running(pid) and time.monotonic() - t0 < 10.0:
            time.sleep(0.02)
        took = time.monotonic() - t0
        assert not running(pid) and took < 1.0 + 2.0, ("the member outlived its fenced agent", took)
        where = f"controller at 127.0.0.1:{port}"
        assert fenced == (
            f"resihp agent: node 1: {where} unreachable for 1 s; killed 1 member(s), "
            f"waiting up to 1 s for a new {where}\n"
        )
        _, err = agent.communicate(timeout=30)
        took = time.monotonic() - t0
        assert agent.returncode == FENCED_EXIT and took < 1.0 + 2.0 + 1.0, (agent.returncode, took, err)
        assert err == f"resihp agent: node 1: no new {where} within 1 s (--wait-s); exiting\n"
    finally:
        for proc in (agent, host):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def test_the_inbox_log_takes_many_messages_per_read_each_once_in_each_senders_order(monkeypatch):
    """`StoreLog` (the controller's inbox): 4 senders append 300 messages each while the reader
    takes them: every message arrives once, each sender's in order; a read of messages already
    there is two round trips however many there are, an empty poll one."""
    import resihp.runtime.control.transport as transport_mod

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    transport = Transport("127.0.0.1", store.port)
    inbox = transport.inbox()
    assert inbox.recv() is None

    def send(sender: int) -> None:
        out = transport.inbox()
        for i in range(300):
            out.send(Joining(sender, i))

    threads = [threading.Thread(target=send, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    got: dict[int, list[int]] = {s: [] for s in range(4)}
    deadline = time.monotonic() + 60
    while sum(map(len, got.values())) < 1200 and time.monotonic() < deadline:
        msg = inbox.recv(0.5)
        if msg is not None:
            got[msg.device].append(msg.generation)
    for t in threads:
        t.join()
    assert got == {s: list(range(300)) for s in range(4)} and inbox.recv() is None

    calls = []
    real = transport_mod._store_op
    monkeypatch.setattr(transport_mod, "_store_op", lambda *a: calls.append(a[2]) or real(*a))
    assert inbox.recv() is None and calls == ["compare_set"]
    send(7)
    calls.clear()
    assert [inbox.recv().generation for _ in range(300)] == list(range(300))
    assert calls == ["compare_set", "compare_set"]
    send(8)
    calls.clear()
    assert [m.generation for m in inbox.recv_all()] == list(range(300)) and inbox.recv_all() == []
    assert calls == ["compare_set", "compare_set", "compare_set"]  # the batch's read, then one poll
    transport.close()


def test_a_channel_notes_its_last_send_and_a_child_starts_without_it():
    """`sent_at` moves on each send (the member's heartbeat thread reads it); a channel handed to a
    child process (pickled) has sent nothing there yet."""
    import pickle
    import queue

    from resihp.runtime.control.transport import Channel, StoreQueue

    ch = Channel(queue.Queue())
    t0 = time.monotonic()
    ch.send(Joining(0, 0))
    assert t0 <= ch.sent_at <= time.monotonic()
    moved = Channel(StoreQueue("127.0.0.1", 1, "k"))
    moved.sent_at = 5.0
    back = pickle.loads(pickle.dumps(moved))
    assert back.sent_at == float("-inf") and back.queue.key == "k"
