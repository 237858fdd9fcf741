"""The control plane's protocol: typed messages as bytes, one dispatch table per receiver, store values."""

import dataclasses
import pickle
import queue

import pytest

from resihp.core.faults import FaultSpec
from resihp.core.model_spec import ModelSpec
from resihp.core.plan import Plan
from resihp.core.trace_format import LossRow
from resihp.runtime.control.board import Board
from resihp.runtime.control.controller import Controller
from resihp.runtime.control.liveness import Liveness
from resihp.runtime.control.processes import Processes
from resihp.runtime.control.protocol import (
    FROM_AGENT,
    FROM_MEMBER,
    MESSAGES,
    TO_AGENT,
    TO_AGENT_BEATS,
    TO_CONTROLLER,
    Decision,
    Dispatch,
    Done,
    Gate,
    Generation,
    Joining,
    Kill,
    Kind,
    ProtocolError,
    Record,
    Spawn,
    Verdict,
    decode,
    encode,
)
from resihp.runtime.control.transport import Channel

SPEC = ModelSpec("t", 4, 32, 8, 2, 48, 256)

SAMPLES = {
    Kind.JOINING: (3, 1),
    Kind.JOINED: (3, 1, 0.01, 0.02, 0.03, 0.04),
    Kind.REACHED: (3, 1, 7, (LossRow(4, 1.25, 31),), 0.5),
    Kind.RECORD: (3, 1, 7, b'{"iter": 7, "instrs": [["F", 0, 1, 0.1, 0.0]], "links": []}'),
    Kind.ABORT: (3, 1, 7, "RuntimeError: Connection closed by peer", 6),
    Kind.ERROR: (3, "Traceback ..."),
    Kind.STOPPING: (3, 7, 1234.5, True),
    Kind.SAVED: (3, 1, 6),
    Kind.STATE: (3, {"embed.weight": [[0.0]]}),
    Kind.DONE: (3,),
    Kind.HEARTBEAT: (3, 1234.5, 4242),
    Kind.AGENT: (1, 99.0, {2: 98.75, 3: 98.5}),
    Kind.SPAWNED: (3, 4242, 1),
    Kind.EXITED: (3, -9, 1, 4242),
    Kind.SPAWN: (3, b"\x00blob"),
    Kind.KILL: (3,),
    Kind.SHUTDOWN: (5.0,),
}


def test_every_kind_has_one_frozen_message_that_travels_as_bytes():
    """17 kinds, one dataclass each; each message encodes to bytes and decodes equal, and cannot be
    mutated; every kind has exactly one receiver."""
    assert set(MESSAGES) == set(Kind) == set(SAMPLES) and len(Kind) == 17
    for kind, args in SAMPLES.items():
        msg = MESSAGES[kind](*args)
        data = encode(msg)
        assert isinstance(data, bytes) and decode(data) == msg and decode(data).kind is kind
        with pytest.raises(dataclasses.FrozenInstanceError):
            msg.device = 0
    receivers = [FROM_MEMBER, FROM_AGENT, TO_AGENT, TO_AGENT_BEATS]
    assert sum(len(r) for r in receivers) == len(Kind) and set().union(*receivers) == set(Kind)
    assert TO_CONTROLLER == FROM_MEMBER | FROM_AGENT


def test_decode_rejects_bytes_that_hold_no_message():
    with pytest.raises(ProtocolError, match="not a message"):
        decode(pickle.dumps(("reached", 1, {"iter": 3})))  # the old tuple format


def test_dispatch_raises_on_a_kind_it_does_not_handle():
    """A table handles exactly the kinds it was built for; any other kind raises instead of being
    dropped, and a table that misses (or adds) a kind of its receiver is refused when built."""
    got = []
    table = Dispatch({Kind.SPAWN: got.append, Kind.KILL: got.append, Kind.SHUTDOWN: got.append}, TO_AGENT)
    table(Kill(2))
    assert got == [Kill(2)]
    with pytest.raises(ProtocolError, match="unexpected message Done"):
        table(Done(2))
    with pytest.raises(ProtocolError):
        table(("kill", 2))  # not a message at all
    with pytest.raises(AssertionError, match="expected"):
        Dispatch({Kind.SPAWN: got.append}, TO_AGENT)


def test_the_controllers_table_covers_every_kind_it_can_receive_and_refuses_the_others():
    """The controller's handlers are the member kinds; with the agents' reports added by Processes
    they are every kind sent to a controller. A command meant for an agent raises there."""
    handlers = Controller.handlers(Controller.__new__(Controller))
    assert set(handlers) == FROM_MEMBER
    procs = Processes(None, Channel(queue.Queue()), Liveness(), None, 2.0, 10.0, handlers)
    assert set(procs.dispatch.handlers) == TO_CONTROLLER
    with pytest.raises(ProtocolError, match="unexpected message Spawn"):
        procs.dispatch(Spawn(0, b""))


def test_channel_carries_messages_in_order_and_says_when_empty():
    ch = Channel(queue.Queue())
    ch.send(Joining(1, 0))
    ch.send(Record(1, 0, 0, b'{"iter": 0}'))
    assert ch.recv() == Joining(1, 0) and ch.recv(0.01) == Record(1, 0, 0, b'{"iter": 0}')
    assert ch.recv() is None and ch.recv(0.01) is None


class DictStore:
    """The part of a c10d store the board uses, in memory (every key already written)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def set(self, key: str, value) -> None:
        self.data[key] = value.encode() if isinstance(value, str) else value

    def get(self, key: str) -> bytes:
        return self.data[key]

    def wait(self, keys, timeout) -> None:
        assert all(k in self.data for k in keys)


def test_board_stores_typed_values_under_the_protocols_keys():
    """A generation, a gate and a decision (with the faults a commit resolved) read back as written,
    under plan/{g}, go/{g} and decision/{g}/{k}; the last generation is None."""
    store = DictStore()
    controller, member = Board(store), Board(store)
    plan = Plan.uniform(SPEC, 1, 1, 2, 1)
    stop = FaultSpec("stop", device=1, at_iter=3)
    body = Generation(1, plan, (0, 1), 2, (0, plan), (stop,))
    controller.publish(body, 1)
    controller.gate(1, Gate.GO)
    controller.decide(1, 2, Decision(Verdict.NEXT, (stop,)))
    controller.decide(1, 3, Decision(Verdict.ABORT))
    controller.publish(None, 2)
    assert set(store.data) == {"plan/1", "go/1", "decision/1/2", "decision/1/3", "plan/2"}
    assert member.generation(1) == body and member.wait_gate(1) is Gate.GO
    assert member.decision(1, 2) == Decision(Verdict.NEXT, (stop,))
    assert member.decision(1, 3).faults is None and member.generation(2) is None
