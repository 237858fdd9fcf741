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
`Piece`. A part no live copy holds comes from `fallback` when one is given (the simulator's
persisted snapshot, -1), else is an error. A device whose stage, split and rank are unchanged
needs nothing, so a migration-only replan moves 0 bytes, and the work scales with the devices that
change, not with the cluster. The same parts per receiver and link, without choosing senders, are
`transfer_volume.inflow` (the simulator's pause, sched/reconfig.py).

Figures (bytes count the parameter and `kinds - 1` moments, `ELEMENT_BYTES` each):
`bytes_moved` — received from another device; `lower_bound_bytes` — the bytes of needed ranges
the receiver does not hold itself, which any transfer must move (computed apart from the choice of
senders); `max_received_bytes` — the most one device receives. Nothing here is priced in seconds.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache

from .model_spec import ModelSpec
from .plan import Plan, Stage
from .shard_layout import full_shape, layer_param_names, shard_range, stage_param_names

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
        self.breaks: list[int] | None = None
        self.combos: list[tuple] | None = None
        self.rows: dict[tuple, tuple[int, int, int]] = {}  # `inflow`'s parts per copies and shards
        self.spans_of: dict[tuple, tuple[tuple[int, int], ...]] = {}
        self.shards_of: dict[tuple, frozenset] = {}
        self.by_run: dict[tuple, tuple[int, int, int]] = {}  # `inflow`'s elements per run and shards

    def key(self, name: str) -> tuple:
        """The tensor kind and the stage holding it in every replica: what its copies depend on."""
        if name not in self.keys:
            self.keys[name] = self.key_at(_key(name), _layer_of(self.old.model, name))
        return self.keys[name]

    def key_at(self, kind: str, k: int) -> tuple:
        """`key` of the tensor of kind `kind` (`_key`) in layer `k`."""
        return (kind, self.stages_at(k))

    def stages_at(self, k: int) -> tuple[int, ...]:
        """The old stage holding layer `k`, per replica."""
        if self.combos is None:
            self.combos = [tuple(at[j] for at in self.stage_at) for j in range(self.old.model.num_layers)]
        return self.combos[k]

    def of(self, name: str) -> list[tuple[int, int, list[tuple[int, int]]]]:
        return self.of_key(self.key(name))

    def of_key(self, key: tuple) -> list[tuple[int, int, list[tuple[int, int]]]]:
        spec = self.old.model
        if key not in self.cache:
            groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
            rows: dict[tuple, tuple[int, int]] = {}  # (split, rank) -> rows: replicas mostly agree
            for at, holder, dev in self._usable(key[1]):
                if at not in rows:
                    rows[at] = _interval(spec, key[0], *at)
                groups.setdefault(rows[at], []).append((holder, dev))
            self.cache[key] = [(a, b, h) for (a, b), h in sorted(groups.items())]
        return self.cache[key]

    def _usable(self, combo: tuple[int, ...]):
        """(shard (tp_split, ffn_split, rank), holder, device) of every usable copy held by the
        old stages `combo` (one per replica): a live device's own, or a lost one's snapshot."""
        for stages, i in zip(self.old.replicas, combo):
            st = stages[i]
            for r, dev in enumerate(st.devices):
                holder = dev if dev in self.alive else self.snapshots.get(dev)
                if holder in self.alive:
                    yield (st.tp_split, st.ffn_split, r), holder, dev

    def shards(self, combo: tuple[int, ...]) -> frozenset:
        """The distinct shards (tp_split, ffn_split, rank) of the usable copies of `combo`'s
        stages: with the tensor kind, all that the copies' ranges depend on (`spans`)."""
        out = self.shards_of.get(combo)
        if out is None:
            out = self.shards_of[combo] = frozenset(at for at, _, _ in self._usable(combo))
        return out

    def spans(self, kind: str, shards: frozenset) -> tuple[tuple[int, int], ...]:
        """The distinct ranges [a, b) of tensor kind `kind` that copies of `shards` hold, sorted:
        those of `of_key`."""
        key = (kind, shards)
        out = self.spans_of.get(key)
        if out is None:
            spec = self.old.model
            out = self.spans_of[key] = tuple(sorted({_interval(spec, kind, *at) for at in shards}))
        return out

    def runs(self, layers: tuple[int, int]) -> list[tuple[int, int, list[str]]]:
        """[(k, count, kinds)]: the tensors of a stage of `layers` as runs of the layers the old
        plan holds alike (the same `key`): the run's first layer, its length and its tensor kinds
        (`_key`); the embedding and the head are runs of one."""
        spec, (lo, hi) = self.old.model, layers
        out = [(0, 1, ["embed.weight"])] if lo == 0 else []
        if self.breaks is None:  # layers where some replica's old stage changes
            n = spec.num_layers
            self.breaks = [k for k in range(1, n) if any(s[k] != s[k - 1] for s in self.stage_at)] + [n]
        kinds = layer_param_names(spec, 0)
        k = lo
        while k < hi:
            end = min(hi, self.breaks[bisect.bisect_right(self.breaks, k)])
            out.append((k, end - k, kinds))
            k = end
        if hi == spec.num_layers:
            out.append((hi - 1, 1, ["norm.weight", "lm_head.weight"]))
        return out

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


def positions(plan: Plan, only: set[int] | None = None) -> dict[int, tuple[Stage, int]]:
    """device -> (its stage, its TP rank) for every plan device, or for those in `only` (one pass:
    `stage_of` per device would be quadratic at 16,384 devices)."""
    return {
        d: (st, r)
        for stages in plan.replicas
        for st in stages
        for r, d in enumerate(st.devices)
        if only is None or d in only
    }


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


def _changed(old: Plan, new: Plan, alive: set[int]) -> list[tuple[int, Stage, int]]:
    """[(device, its new stage, its TP rank)] of the devices of `new` whose shard is not the one
    they hold under `old` (a stage of `old` on the same live devices keeps every shard), by device."""
    kept = {st for stages in old.replicas for st in stages}
    changed = [
        s for stages in new.replicas for s in stages if s not in kept or not alive.issuperset(s.devices)
    ]
    was = positions(old, {d for s in changed for d in s.devices})
    out = []
    for dev, (st, r) in sorted((d, (s, k)) for s in changed for k, d in enumerate(s.devices)):
        before = was.get(dev) if dev in alive else None
        if before is None or (before[0].layers, before[0].tp_split, before[0].ffn_split, before[1]) != (
            st.layers, st.tp_split, st.ffn_split, r,
        ):  # fmt: skip
            out.append((dev, st, r))
    return out


def plan_transfer(
    old: Plan,
    new: Plan,
    alive: Iterable[int],
    snapshots: dict[int, int] | None = None,
    node_of: Callable[[int], int] | None = None,
    kinds: int = KINDS,
    fallback: int | None = None,
) -> TransferPlan:
    """The transfer from the state held under `old` (by the `alive` devices, plus the snapshot
    copies `snapshots`: lost device -> the live device keeping it) into `new`. `node_of(device)`
    gives a device's node (default: every device on its own node). A range no live device holds
    comes from `fallback` (the simulator's persisted snapshot, sender = source = `fallback`, not
    counted in the senders' balance); without one, ValueError naming the tensor and its rows."""
    spec = old.model
    alive = set(alive)
    snaps = dict(snapshots or {})
    node = node_of or (lambda d: d)
    copies = _Copies(old, alive, snaps, node)
    load: dict[int, int] = {}
    pieces: list[Piece] = []
    received: dict[int, int] = {}
    lower = 0
    for dev, st, r in _changed(old, new, alive):
        for name in stage_param_names(spec, st.layers):
            need = interval(spec, name, st, r)
            row = extent(spec, name)[2] * ELEMENT_BYTES * kinds
            cands = copies.of(name)
            near = copies.on_node(name, node(dev))
            own = [c for c in near if c[2] == dev]
            lower += _uncovered(need, [(a, b) for a, b, _, _ in own]) * row
            got = _cover(name, need, cands, own, near, load, row, fallback)
            for lo, hi, s, src in got:
                nbytes = (hi - lo) * row
                pieces.append(Piece(dev, name, lo, hi, s, src, nbytes))
                if s != dev:
                    received[dev] = received.get(dev, 0) + nbytes
    return TransferPlan(tuple(pieces), kinds, lower, received)


OWN, NODE, OTHER, NONE = range(4)  # where a part of a needed range comes from


def _segments(need, cands, own, near) -> list[tuple[int, int, int, list[tuple[int, int]]]]:
    """`need` cut at every copy boundary: [(x, y, where, options)], `where` the closest copies
    of rows [x, y) (OWN: the receiver's, `own`; NODE: on its node, `near`; OTHER: elsewhere;
    NONE: no live copy), `options` their (sender, source) pairs."""
    lo, hi = need
    cuts = sorted({lo, hi} | {x for a, b, _ in cands for x in (a, b) if lo < x < hi})
    out = []
    for x, y in zip(cuts, cuts[1:]):
        opts = [(s, src) for a, b, s, src in own if a <= x and y <= b]
        if opts:
            out.append((x, y, OWN, opts[:1]))
            continue
        opts = [(s, src) for a, b, s, src in near if a <= x and y <= b]
        if opts:
            out.append((x, y, NODE, opts))
            continue
        opts = [h for a, b, hs in cands if a <= x and y <= b for h in hs]
        out.append((x, y, OTHER if opts else NONE, opts))
    return out


def _cover(name, need, cands, own, near, load, row, fallback=None) -> list[tuple[int, int, int, int]]:
    """`need` cut at every copy boundary (`_segments`), each part from the closest, least loaded
    copy (`fallback` when there is none), adjacent parts of one copy merged: [(lo, hi, sender,
    source)]."""
    out: list[list[int]] = []
    for x, y, where, opts in _segments(need, cands, own, near):
        if where == OWN:
            best = opts[0]
        elif where != NONE:
            _, s, src = min((load.get(s, 0), s, src) for s, src in opts)
            best = (s, src)
            load[s] = load.get(s, 0) + (y - x) * row
        elif fallback is not None:
            best = (fallback, fallback)
        else:
            raise ValueError(f"no live copy of {name} rows [{x}, {y}): every device holding them is lost")
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
