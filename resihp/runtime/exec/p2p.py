"""Tag-free point-to-point: which messages a device posts at which instruction, matched by order.

NCCL ignores tags, so messages between two devices can only be matched by the order in which the
two ends post them. The rule (one for gloo and NCCL): for every ordered pair of devices (a, b),
the k-th receive b posts from a is the k-th send a posts to b, and a posts its sends in its own
program order. The compiled Program does not keep the two orders equal by itself: a plan with
migrated micro-batches takes its chunk orders from a list-scheduling run, and a stage may then
receive a peer's blocks in another order than the peer sends them (`tests/runtime/test_p2p.py`
finds such pairs). So the receiver posts in the *sender's* order: at a RECV of message k from a, it
also posts every earlier message of a that its own program receives later, into buffers that wait
for their RECV. Every device knows every device's program (`compile_plan` is a pure function of
the Plan), so no message is needed to agree on this.

Posting happens in *runs*: a maximal sequence of consecutive SEND/RECV instructions is posted as
one batch at its first instruction (`dist.batch_isend_irecv`, a single NCCL group), the way
Megatron pairs "send forward, receive backward" — under NCCL's rendezvous semantics two stages
that each send to the other before receiving would otherwise wait on each other. The receiver then
waits for a block at its RECV instruction, exactly where a tagged receive waited before, so the
posting order adds no waiting. `tests/runtime/test_p2p.py` executes the posting plans of random
plans (every schedule, TP sizes, migrations, hollow stages, both P2P modes) in an abstract machine
with blocking collectives, in two semantics: sends complete once posted (gloo's isend) and every
batch completes as a whole before the device goes on (NCCL groups on one stream); none deadlocks.

Blocks (`p2p` mode, `worker.py`): between stages of TP sizes t and t', `n = 1` ("root") or
`min(t, t')` ("chunked") links; TP rank r < n of the sender sends row block r to TP rank r of the
receiver. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from resihp.core.plan import Plan
from resihp.core.program import Instr, Program

P2P_OPS = ("SEND", "RECV")


@dataclass(frozen=True)
class Message:
    """One P2P block: `what` ("act" | "grad") of micro-batch (src, mb), from `sender` to `receiver`
    (device ids); it is the block of TP rank `rank` of both stages, out of `links` blocks."""

    sender: int
    receiver: int
    what: str
    src: int
    mb: int
    rank: int
    links: int

    @property
    def key(self) -> tuple[str, int, int]:
        """What identifies it at its receiver (one sender per receiver and block)."""
        return self.what, self.src, self.mb


@dataclass(frozen=True)
class Post:
    """One operation of a batch: send (`send` True) or receive `message`."""

    send: bool
    message: Message


def num_links(plan: Plan, mode: str, a: tuple[int, int], b: tuple[int, int]) -> int:
    """Parallel P2P links between the stages a and b ((replica, stage)): 1 or min of the TP sizes."""
    if mode == "root":
        return 1
    return min(plan.replicas[a[0]][a[1]].tp, plan.replicas[b[0]][b[1]].tp)


def message_of(plan: Plan, mode: str, device: int, ins: Instr) -> Message | None:
    """The block `device` sends (SEND) or receives (RECV) at `ins`; None for a TP rank without a link."""
    where = plan.stage_of(device)
    rank = plan.replicas[where[0]][where[1]].devices.index(device)
    n = num_links(plan, mode, where, ins.peer)
    if rank >= n:
        return None
    other = plan.replicas[ins.peer[0]][ins.peer[1]].devices[rank]
    sender, receiver = (device, other) if ins.op == "SEND" else (other, device)
    return Message(sender, receiver, ins.what, ins.src, ins.mb, rank, n)


def sends_in_order(program: Program, mode: str, device: int) -> list[Message]:
    """Every block `device` sends in one iteration, in its program order (= posting order)."""
    plan = program.plan
    out = []
    for ins in program.instructions(device):
        if ins.op == "SEND" and (m := message_of(plan, mode, device, ins)) is not None:
            out.append(m)
    return out


def runs(instrs: list[Instr]) -> list[tuple[int, int]]:
    """[start, stop) of every maximal run of consecutive SEND/RECV instructions."""
    out, start = [], None
    for i, ins in enumerate([*instrs, None]):
        p2p = ins is not None and ins.op in P2P_OPS
        if p2p and start is None:
            start = i
        elif not p2p and start is not None:
            out.append((start, i))
            start = None
    return out


def post_schedule(program: Program, mode: str, device: int) -> dict[int, tuple[Post, ...]]:
    """Instruction index -> the batch `device` posts there (the first instruction of each run that
    has any block to post): its sends in program order, then its receives in their senders' orders
    (earlier blocks of a sender included, module doc). Every receive is posted exactly once."""
    plan = program.plan
    instrs = program.instructions(device)
    order: dict[int, list[Message]] = {}  # sender -> what it sends this device, in its order
    posted: dict[int, int] = {}  # sender -> how many of its messages are posted
    out: dict[int, tuple[Post, ...]] = {}
    for start, stop in runs(instrs):
        batch: list[Post] = []
        for ins in instrs[start:stop]:
            m = message_of(plan, mode, device, ins)
            if m is None:
                continue
            if ins.op == "SEND":
                batch.append(Post(True, m))
                continue
            if m.sender not in order:
                order[m.sender] = [x for x in sends_in_order(program, mode, m.sender) if x.receiver == device]
                posted[m.sender] = 0
            seq = order[m.sender]
            k = seq.index(m)
            while posted[m.sender] <= k:
                batch.append(Post(False, seq[posted[m.sender]]))
                posted[m.sender] += 1
        if batch:
            out[start] = tuple(batch)
    for sender, seq in order.items():
        assert posted[sender] == len(seq), (device, sender, posted[sender], len(seq))
    return out
