"""The transfer planner: which slices of which tensors every device of a new Plan lacks, and who
sends each one (issue 17). Torch-free, a pure function of its inputs, so every member of a
generation computes the same plan and no message is needed to agree on it.

A device's state under a Plan is, for every tensor its stage holds, one contiguous range of the
tensor's split axis (`shard_layout.shard_range`: query / kv / FFN rows or columns) or the whole
tensor (norms, embedding, LM head), each with its two AdamW moments. A *copy* of a range lives on
every live device whose old shard covers it, and — for a lost device only — on the live device
that keeps its snapshot (`snapshots`: lost device -> holder, only copies that exist). For each
device of the new Plan and each tensor of its new stage, the planner cuts the range it needs at
every boundary of the copies and takes each part from the cheapest copy: its own (nothing moves),
then a device on its node, then another node; among equally close copies the sender with the
fewest bytes assigned so far (balanced senders). Adjacent parts from the same copy merge into one
`Piece`. A device whose stage, split and rank are unchanged needs nothing, so a migration-only
replan moves 0 bytes, and the work scales with the devices that change, not with the cluster.

Figures (bytes count the parameter and `kinds - 1` moments, `ELEMENT_BYTES` each):
`bytes_moved` — received from another device; `lower_bound_bytes` — the bytes of needed ranges
the receiver does not hold itself, which any transfer must move (computed apart from the choice of
senders); `max_received_bytes` — the most one device receives. Nothing here is priced in seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache

from .model_spec import ModelSpec
from .plan import Plan, Stage
from .shard_layout import full_shape, shard_range, stage_param_names

ELEMENT_BYTES = 4  # parameters and AdamW moments are fp32 on every backend (bf16 is autocast only)
KINDS = 3  # parameter, exp_avg, exp_avg_sq (1 before the first optimizer step)


@dataclass(frozen=True)
class Piece:
    """Rows [lo, hi) of tensor `name`'s split axis (`extent`), sent by `sender` to `receiver`
    from the old shard of `source` (`sender` itself, or a lost device whose snapshot it keeps).
    `sender == receiver` is a local copy."""

    receiver: int
    name: str
    lo: int
    hi: int
    sender: int
    source: int
    nbytes: int


@dataclass(frozen=True)
class TransferPlan:
    """`pieces` in a fixed order (receiver, then its new stage's canonical tensor order, then
    rows): between two devices, the k-th piece of this order is the k-th one sent."""

    pieces: tuple[Piece, ...]
    kinds: int
    lower_bound_bytes: int
    received: dict[int, int] = field(default_factory=dict)  # receiver -> bytes from others

    @property
    def bytes_moved(self) -> int:
        return sum(self.received.values())

    @property
    def max_received_bytes(self) -> int:
        return max(self.received.values(), default=0)

    def figures(self) -> dict[str, int]:
        """The `state-transfer` event's and `resihp plan --json`'s numbers."""
        return {
            "bytes_moved": self.bytes_moved,
            "lower_bound_bytes": self.lower_bound_bytes,
            "max_received_bytes": self.max_received_bytes,
        }


@lru_cache(maxsize=4096)
def extent(spec: ModelSpec, name: str) -> tuple[int, int, int]:
    """(axis, its length, elements per row of it) of tensor `name`: the axis TP shards split
    (0 for a tensor never split)."""
    shape = full_shape(spec, name)
    full = shard_range(spec, name, (spec.heads,), (spec.ffn,), 0)
    axis = 0 if full is None else full[0]
    per_row = 1
    for k, n in enumerate(shape):
        per_row *= 1 if k == axis else n
    return axis, shape[axis], per_row


def _key(name: str) -> str:
    """Tensors of the same kind in different layers are sliced alike: one cache entry for all."""
    return "layers.0." + name.split(".", 2)[2] if name.startswith("layers.") else name


@lru_cache(maxsize=65536)
def _interval(spec: ModelSpec, key: str, tp_split, ffn_split, rank: int) -> tuple[int, int]:
    rng = shard_range(spec, key, tp_split, ffn_split, rank)
    return (0, extent(spec, key)[1]) if rng is None else (rng[1], rng[2])


def interval(spec: ModelSpec, name: str, st: Stage, rank: int) -> tuple[int, int]:
    """Rows [a, b) of `name`'s split axis that TP rank `rank` of stage `st` holds."""
    return _interval(spec, _key(name), st.tp_split, st.ffn_split, rank)


def shard_bytes(spec: ModelSpec, st: Stage, rank: int, kinds: int = KINDS) -> int:
    """Bytes of state TP rank `rank` of `st` holds (parameters and `kinds - 1` moments)."""
    total = 0
    for name in stage_param_names(spec, st.layers):
        a, b = interval(spec, name, st, rank)
        total += (b - a) * extent(spec, name)[2]
    return total * ELEMENT_BYTES * kinds


def _layer_of(spec: ModelSpec, name: str) -> int:
    if name.startswith("layers."):
        return int(name.split(".", 2)[1])
    return 0 if name == "embed.weight" else spec.num_layers - 1


class _Copies:
    """name -> [(a, b, holders)]: the usable copies of ranges of `name` in the old Plan, one entry
    per distinct range, `holders` its (sender, source) pairs. Layers held by the same stages are
    sliced alike, so the entries are computed once per tensor kind and stage combination."""

    def __init__(self, old: Plan, alive: set[int], snapshots: dict[int, int], node=None) -> None:
        self.old, self.alive, self.snapshots, self.node = old, alive, snapshots, node
        self.stage_at = [
            [i for i, st in enumerate(stages) for _ in range(st.num_layers)] for stages in old.replicas
        ]
        self.cache: dict[tuple, list[tuple[int, int, list[tuple[int, int]]]]] = {}
        self.nodes: dict[tuple, dict[int, list[tuple[int, int, int, int]]]] = {}
        self.keys: dict[str, tuple] = {}

    def key(self, name: str) -> tuple:
        """The tensor kind and the stage holding it in every replica: what its copies depend on."""
        if name not in self.keys:
            k = _layer_of(self.old.model, name)
            self.keys[name] = (_key(name), tuple(at[k] for at in self.stage_at))
        return self.keys[name]

    def of(self, name: str) -> list[tuple[int, int, list[tuple[int, int]]]]:
        spec = self.old.model
        key = self.key(name)
        if key not in self.cache:
            groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
            rows: dict[tuple, tuple[int, int]] = {}  # (split, rank) -> rows: replicas mostly agree
            for stages, i in zip(self.old.replicas, key[1]):
                st = stages[i]
                for r, dev in enumerate(st.devices):
                    holder = dev if dev in self.alive else self.snapshots.get(dev)
                    if holder in self.alive:
                        at = (st.tp_split, st.ffn_split, r)
                        if at not in rows:
                            rows[at] = interval(spec, name, st, r)
                        groups.setdefault(rows[at], []).append((holder, dev))
            self.cache[key] = [(a, b, h) for (a, b), h in sorted(groups.items())]
        return self.cache[key]

    def on_node(self, name: str, node: int) -> list[tuple[int, int, int, int]]:
        """The copies of `name` whose sender is on `node`: [(a, b, sender, source)]."""
        key = self.key(name)
        if key not in self.nodes:
            by: dict[int, list[tuple[int, int, int, int]]] = {}
            for a, b, hs in self.of(name):
                for s, src in hs:
                    by.setdefault(self.node(s), []).append((a, b, s, src))
            self.nodes[key] = by
        return self.nodes[key].get(node, [])


def positions(plan: Plan) -> dict[int, tuple[Stage, int]]:
    """device -> (its stage, its TP rank) for every plan device (one pass: `stage_of` per device
    would be quadratic at 16,384 devices)."""
    return {d: (st, r) for stages in plan.replicas for st in stages for r, d in enumerate(st.devices)}


def _uncovered(need: tuple[int, int], have: Iterable[tuple[int, int]]) -> int:
    """Rows of `need` no interval of `have` covers."""
    lo, hi = need
    missing, cursor = 0, lo
    for a, b in sorted(have):
        if b <= cursor:
            continue
        if a >= hi:
            break
        if a > cursor:
            missing += a - cursor
        cursor = max(cursor, b)
        if cursor >= hi:
            break
    return missing + max(0, hi - cursor)


def plan_transfer(
    old: Plan,
    new: Plan,
    alive: Iterable[int],
    snapshots: dict[int, int] | None = None,
    node_of: Callable[[int], int] | None = None,
    kinds: int = KINDS,
) -> TransferPlan:
    """The transfer from the state held under `old` (by the `alive` devices, plus the snapshot
    copies `snapshots`: lost device -> the live device keeping it) into `new`. `node_of(device)`
    gives a device's node (default: every device on its own node). ValueError when some range a
    new device needs has no copy left, naming the tensor and its rows."""
    spec = old.model
    alive = set(alive)
    snaps = dict(snapshots or {})
    node = node_of or (lambda d: d)
    copies = _Copies(old, alive, snaps, node)
    load: dict[int, int] = {}
    pieces: list[Piece] = []
    received: dict[int, int] = {}
    lower = 0
    was = positions(old)
    for dev, (st, r) in sorted(positions(new).items()):
        before = was.get(dev) if dev in alive else None
        if before is not None and (before[0].layers, before[0].tp_split, before[0].ffn_split, before[1]) == (
            st.layers, st.tp_split, st.ffn_split, r,
        ):  # fmt: skip
            continue  # the same shard: nothing to copy
        for name in stage_param_names(spec, st.layers):
            need = interval(spec, name, st, r)
            row = extent(spec, name)[2] * ELEMENT_BYTES * kinds
            cands = copies.of(name)
            near = copies.on_node(name, node(dev))
            own = [c for c in near if c[2] == dev]
            lower += _uncovered(need, [(a, b) for a, b, _, _ in own]) * row
            got = _cover(name, need, cands, own, near, dev, load, row)
            for lo, hi, s, src in got:
                nbytes = (hi - lo) * row
                pieces.append(Piece(dev, name, lo, hi, s, src, nbytes))
                if s != dev:
                    received[dev] = received.get(dev, 0) + nbytes
    return TransferPlan(tuple(pieces), kinds, lower, received)


def _cover(name, need, cands, own, near, dev, load, row) -> list[tuple[int, int, int, int]]:
    """`need` cut at every copy boundary, each part from the closest, least loaded copy (`own`:
    the receiver's copies, `near`: those on its node), adjacent parts of one copy merged:
    [(lo, hi, sender, source)]."""
    lo, hi = need
    cuts = sorted({lo, hi} | {x for a, b, _ in cands for x in (a, b) if lo < x < hi})
    out: list[list[int]] = []
    for x, y in zip(cuts, cuts[1:]):
        best = next(((s, src) for a, b, s, src in own if a <= x and y <= b), None)
        if best is None:
            close = [(s, src) for a, b, s, src in near if a <= x and y <= b]
            close = close or [h for a, b, hs in cands if a <= x and y <= b for h in hs]
            if not close:
                raise ValueError(f"no live copy of {name} rows [{x}, {y}): every device holding them is lost")
            _, s, src = min((load.get(s, 0), s, src) for s, src in close)
            best = (s, src)
            load[s] = load.get(s, 0) + (y - x) * row
        if out and out[-1][1] == x and out[-1][2:] == list(best):
            out[-1][1] = y
        else:
            out.append([x, y, *best])
    return [tuple(p) for p in out]


def cover_gaps(old: Plan, alive: Iterable[int], snapshots: dict[int, int] | None = None) -> list[str]:
    """The tensors of `old` whose rows the `alive` devices (and the snapshot copies) no longer
    cover completely, in canonical order: empty when the state can be recovered into any Plan."""
    spec = old.model
    copies = _Copies(old, set(alive), dict(snapshots or {}))
    out = []
    for name in stage_param_names(spec, (0, spec.num_layers)):
        have = [(a, b) for a, b, _ in copies.of(name)]
        if _uncovered((0, extent(spec, name)[1]), have):
            out.append(name)
    return out
