"""The control plane's vocabulary: one frozen dataclass per message kind, the store's keys and values.

Who says what (docs/runtime.md, "Protocol"):

* member -> controller: `Joining`, `Joined`, `Reached`, `Record`, `Abort`, `Error`, `Stopping`,
  `Saved`, `State`, `Done`;
* member -> its node agent: `Heartbeat`;
* agent -> controller: `AgentBeat`, `Spawned`, `Exited`;
* controller -> agent: `Spawn`, `Kill`, `Shutdown`;
* controller -> members, in the c10d store (`board.Board`): a `Generation` under `plan/{g}`, a
  `Gate` under `go/{g}`, a `Decision` under `decision/{g}/{k}`.

Every message names its sender (`device`, or `node` for an agent) and travels as bytes (`encode`,
`decode`: pickle today; the transport, `transport.py`: queues of the c10d store, never looks
inside). A receiver handles its messages through one `Dispatch` table, kind -> handler, which
raises `ProtocolError` on any kind it does not list: a message nobody handles is a bug, never
silently dropped.

Torch-free: the node agents import it.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from resihp.core.faults import FaultSpec
    from resihp.core.plan import Plan
    from resihp.core.trace_format import LossRow

    from ..faults import FaultEnd
    from ..job import JobSpec


ABORT_HUNG_EXIT = 75  # exit code of a member whose NCCL abort did not return (`abort.py`): re-joins fresh


class Kind(Enum):
    JOINING = "joining"
    JOINED = "joined"
    REACHED = "reached"
    RECORD = "iter"
    ABORT = "abort"
    ERROR = "error"
    STOPPING = "stopping"
    SAVED = "saved"
    STATE = "state"
    DONE = "done"
    HEARTBEAT = "heartbeat"
    AGENT = "agent"
    SPAWNED = "spawned"
    EXITED = "exited"
    SPAWN = "spawn"
    KILL = "kill"
    SHUTDOWN = "shutdown"


class ProtocolError(Exception):
    """A message no receiver expects (our bug): an unknown kind, or bytes that are no message."""


MESSAGES: dict[Kind, type] = {}


def _message(kind: Kind):
    def register(cls):
        assert kind not in MESSAGES, f"two messages of kind {kind}"
        cls.kind = kind
        MESSAGES[kind] = cls
        return dataclass(frozen=True)(cls)

    return register


# --------------------------------------------------------------------------- member -> controller
@_message(Kind.JOINING)
class Joining:
    """The member is at generation `generation`'s rendezvous; it waits for `go/{g}`."""

    kind: ClassVar[Kind]
    device: int
    generation: int


@_message(Kind.JOINED)
class Joined:
    """The member joined `generation` (groups built, state received); the seconds it took: leaving
    the previous generation, the rendezvous and group building, the state transfer, the worker;
    the bytes of state it received from other members, and its transfer plan's figures
    (`TransferPlan.figures`, the same on every member; None: no transfer)."""

    kind: ClassVar[Kind]
    device: int
    generation: int
    teardown_s: float
    group_s: float
    transfer_s: float
    build_s: float
    received_bytes: int = 0
    planned: dict | None = None


@_message(Kind.REACHED)
class Reached:
    """A plan device is at the STEP of iteration `iter` and waits for `decision/{g}/{k}`; `losses`
    (its micro-batch losses, last stage only) and `wall_s` make the iteration's row."""

    kind: ClassVar[Kind]
    device: int
    generation: int
    iter: int
    losses: tuple[LossRow, ...]
    wall_s: float


@_message(Kind.RECORD)
class Record:
    """A plan device's trace record of iteration `iter` of `generation`, as its line of the trace
    file (`records.trace_line`, UTF-8, no newline: docs/trace-format.md): encoded once by the
    member; the controller writes it as it is and decodes it only for the slow watch."""

    kind: ClassVar[Kind]
    device: int
    generation: int
    iter: int
    line: bytes


@_message(Kind.ABORT)
class Abort:
    """The member left `generation` at iteration `iter`: a collective failed (a peer died) or the
    controller aborted; `error` says which. `snapshot`: with snapshots, the newest tag it holds
    complete — its own copy and the snapshots it keeps for others (it waited for its exchange in
    flight before reporting) — else None; the recovery restores from it where it covers, without
    a rollback (`adapt/rollback.Snapped`)."""

    kind: ClassVar[Kind]
    device: int
    generation: int
    iter: int
    error: str
    snapshot: int | None


@_message(Kind.ERROR)
class Error:
    """The member raised (a bug or a user error): the job cannot go on."""

    kind: ClassVar[Kind]
    device: int
    traceback: str


@_message(Kind.STOPPING)
class Stopping:
    """An injected `stop` is about to end (or, with `hang`, freeze) the member: when, on the wall
    clock (the recovery measurement's start)."""

    kind: ClassVar[Kind]
    device: int
    iter: int
    time: float
    hang: bool


@_message(Kind.SAVED)
class Saved:
    """The member wrote its shards of the checkpoint after `iter` committed iterations."""

    kind: ClassVar[Kind]
    device: int
    generation: int
    iter: int


@_message(Kind.STATE)
class State:
    """The member's final shard (canonical name -> numpy array), with `JobSpec.return_state`."""

    kind: ClassVar[Kind]
    device: int
    shards: dict


@_message(Kind.DONE)
class Done:
    """The member ran its last iteration (or was told to stop) and exits."""

    kind: ClassVar[Kind]
    device: int


# --------------------------------------------------------------------------- member -> agent
@_message(Kind.HEARTBEAT)
class Heartbeat:
    """The member's process `pid` is alive at `time` (its clock): sent every `liveness.HEARTBEAT_S`."""

    kind: ClassVar[Kind]
    device: int
    time: float
    pid: int


# --------------------------------------------------------------------------- agent -> controller
@_message(Kind.AGENT)
class AgentBeat:
    """The agent of `node` is alive at `time` (its clock); `beats`: device -> arrival of its current
    process's last heartbeat, on the same clock."""

    kind: ClassVar[Kind]
    node: int
    time: float
    beats: dict[int, float]


@_message(Kind.SPAWNED)
class Spawned:
    """The agent started `device`'s member process `pid`."""

    kind: ClassVar[Kind]
    device: int
    pid: int
    node: int


@_message(Kind.EXITED)
class Exited:
    """`device`'s member process `pid` exited with `code` (negative: the signal)."""

    kind: ClassVar[Kind]
    device: int
    code: int
    node: int
    pid: int


# --------------------------------------------------------------------------- controller -> agent
@_message(Kind.SPAWN)
class Spawn:
    """Start a member process for `device`; `blob` = `MemberArgs.encode()` (the agent never opens it)."""

    kind: ClassVar[Kind]
    device: int
    blob: bytes


@_message(Kind.KILL)
class Kill:
    """SIGKILL `device`'s member process (the exit is reported as usual)."""

    kind: ClassVar[Kind]
    device: int


@_message(Kind.SHUTDOWN)
class Shutdown:
    """Give the members `grace_s` to exit by themselves, reap them, exit."""

    kind: ClassVar[Kind]
    grace_s: float


assert set(MESSAGES) == set(Kind), "one message class per kind"

FROM_MEMBER = frozenset(
    (Kind.JOINING, Kind.JOINED, Kind.REACHED, Kind.RECORD, Kind.ABORT, Kind.ERROR, Kind.STOPPING,
     Kind.SAVED, Kind.STATE, Kind.DONE)
)  # fmt: skip
FROM_AGENT = frozenset((Kind.AGENT, Kind.SPAWNED, Kind.EXITED))  # liveness: applied on arrival
TO_CONTROLLER = FROM_MEMBER | FROM_AGENT
TO_AGENT = frozenset((Kind.SPAWN, Kind.KILL, Kind.SHUTDOWN))
TO_AGENT_BEATS = frozenset((Kind.HEARTBEAT,))


def encode(msg) -> bytes:
    """A message as bytes, for any transport."""
    assert type(msg) is MESSAGES.get(getattr(msg, "kind", None)), f"not a message: {msg!r}"
    return pickle.dumps(msg)


def decode(data: bytes):
    """The message `encode` made; ProtocolError for bytes that hold none."""
    msg = pickle.loads(data)
    if type(msg) is not MESSAGES.get(getattr(msg, "kind", None)):
        raise ProtocolError(f"not a message: {msg!r}")
    return msg


class Dispatch:
    """One receiver's table, kind -> handler(message). `expect`: the kinds this receiver can be sent;
    the table must list every one of them and no other. Calling it with a message of any other kind
    raises ProtocolError."""

    def __init__(self, handlers: Mapping[Kind, Callable[[Any], None]], expect: frozenset[Kind]) -> None:
        assert set(handlers) == set(expect), (
            f"handlers for {sorted(k.value for k in handlers)}, expected {sorted(k.value for k in expect)}"
        )
        self.handlers = dict(handlers)

    def __call__(self, msg) -> None:
        handler = self.handlers.get(getattr(msg, "kind", None))
        if handler is None:
            raise ProtocolError(f"unexpected message {msg!r}: this receiver handles {self.kinds()}")
        handler(msg)

    def kinds(self) -> list[str]:
        return sorted(k.value for k in self.handlers)


# --------------------------------------------------------------------------- the store: controller -> members
PG_TIMEOUT_S = 120.0  # store waits and gloo operations; heartbeats, far shorter, decide first


def plan_key(generation: int) -> str:
    return f"plan/{generation}"


def go_key(generation: int) -> str:
    return f"go/{generation}"


def decision_key(generation: int, it: int) -> str:
    return f"decision/{generation}/{it}"


@dataclass(frozen=True)
class Generation:
    """Generation `generation` (published under `plan/{g}`): its Plan, its members (plan and standby
    devices, ranked in ascending id), the iteration it starts at, `source` = (generation, plan) whose
    held state it starts from (None: the seed or a checkpoint), every fault resolved so far, and
    `restore`: the checkpoint it loads when the job restarts from one (`adapt/restart.py`; None: the
    seed or the `--resume` checkpoint when `source` is None)."""

    generation: int
    plan: Plan
    members: tuple[int, ...]
    start: int
    source: tuple[int, Plan] | None
    faults: tuple[FaultSpec | FaultEnd, ...]
    restore: str | None = None


class Gate(Enum):
    """The controller's word on a generation's rendezvous (`go/{g}`)."""

    GO = "go"  # every member of g arrived, alive: rendezvous now
    ABORT = "abort"  # g was superseded before its rendezvous: wait for g+1


class Verdict(Enum):
    """The controller's word on iteration k of generation g, once every plan device reached its STEP."""

    COMMIT = "commit"  # apply the step, go on with k + 1
    NEXT = "next"  # apply the step, then leave g for `plan/{g+1}` (starting at k + 1)
    ABORT = "abort"  # a member died: skip the step (the state stays the one committed at k - 1), leave g


@dataclass(frozen=True)
class Decision:
    """`decision/{g}/{k}`: the verdict, and — when this commit resolved time-keyed faults or fault
    ends (`faults.TimedFaults`) — every fault resolved so far, which replace the members' own."""

    verdict: Verdict
    faults: tuple[FaultSpec | FaultEnd, ...] | None = None

    def encode(self) -> bytes:
        return pickle.dumps(self)


def read_decision(value: bytes) -> Decision:
    """The `Decision` that `Decision.encode` wrote (read from the store, or relayed: `relay.py`)."""
    decision = pickle.loads(value)
    assert isinstance(decision, Decision), decision
    return decision


@dataclass(frozen=True)
class MemberArgs:
    """What a member process starts with: its first generation (a member that re-joins a running
    job starts in g > 0: it holds nothing of `source` but takes part in its transfer), the job, its
    device, and the address of the controller's store (`host` as the member's host reaches it)."""

    generation: Generation
    job: JobSpec
    device: int
    port: int
    host: str = "127.0.0.1"

    def encode(self) -> bytes:
        return pickle.dumps(self)

    @staticmethod
    def decode(blob: bytes) -> MemberArgs:
        args = pickle.loads(blob)
        assert isinstance(args, MemberArgs), args
        return args
