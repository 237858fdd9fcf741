"""The agent's decision relay (`runtime/control/relay.py`): one store read per decision per node,
the members' answers, and its failures, against a real `TCPStore` in this process."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

dist = pytest.importorskip("torch.distributed")

from resihp.runtime.control.board import Board  # noqa: E402
from resihp.runtime.control.protocol import Decision, Verdict  # noqa: E402
from resihp.runtime.control.relay import KEEP, DecisionRelay, Relayed  # noqa: E402


class CountedRelay(DecisionRelay):
    """A relay whose store clients count their reads, per key."""

    def __init__(self, *args) -> None:
        self.reads: Counter = Counter()
        super().__init__(*args)

    def client(self):
        store, reads = super().client(), self.reads

        class Counting:
            def get(self, key):
                reads[key] += 1
                return store.get(key)

        return Counting()


@pytest.fixture
def store():
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def test_one_read_per_decision_for_every_member_cached_and_evicted(store):
    board, relay = Board(store), CountedRelay("127.0.0.1", store.port, 10.0)
    members = [Relayed(relay.connect()) for _ in range(4)]
    got = [None] * len(members)

    def ask(i: int) -> None:
        got[i] = members[i].decision(0, 0)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(members))]
    for t in threads:
        t.start()
    time.sleep(0.3)  # every member asks before the controller decides
    assert got == [None] * len(members)
    faults = ()
    board.decide(0, 0, Decision(Verdict.NEXT, faults))
    for t in threads:
        t.join(10.0)
    assert got == [Decision(Verdict.NEXT, faults)] * len(members)
    assert members[2].decision(0, 0).verdict is Verdict.NEXT  # a late asker: from the relay's copy
    assert relay.reads == Counter({"decision/0/0": 1})
    for k in range(1, KEEP + 1):  # the relay keeps the last KEEP: decision/0/0 drops out
        board.decide(0, k, Decision(Verdict.COMMIT))
        assert [m.decision(0, k).verdict for m in members] == [Verdict.COMMIT] * len(members)
    assert members[1].decision(0, 0).verdict is Verdict.NEXT
    assert relay.reads["decision/0/0"] == 2 and sum(relay.reads.values()) == KEEP + 2
    relay.close()


def test_a_decision_never_written_a_dead_member_and_a_dead_agent(store):
    relay = DecisionRelay("127.0.0.1", store.port, 0.3)  # the store's timeout, short
    member, gone = Relayed(relay.connect()), relay.connect()
    with pytest.raises(RuntimeError, match="decision/0/7: the node agent could not read it from the store"):
        member.decision(0, 7)
    gone.close()  # a member that exited: its pipe is dropped, the others are served on
    deadline = time.monotonic() + 5.0
    while len(relay.conns) > 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(relay.conns) == 1
    Board(store).decide(0, 8, Decision(Verdict.ABORT))
    assert member.decision(0, 8).verdict is Verdict.ABORT
    relay.close()  # the agent is gone: its members raise instead of waiting for ever
    with pytest.raises(RuntimeError, match="decision/0/9: the node agent is gone"):
        member.decision(0, 9)
