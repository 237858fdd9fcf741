"""The transfer planner's bytes per receiver, by where they come from (issue 19: the simulator's
pause follows them, sched/reconfig.py). `inflow` gives, for every device of a new Plan, the bytes
`plan_transfer` sends it from a copy on its own node, from another node, and for rows no live
device holds (the simulator's persisted snapshot), from the same parts and the same closest
copies (`transfer_plan._segments`), without choosing among equally close senders: which of them
sends a part changes neither its bytes nor its link. That choice is what makes the tensor-level
planner slow at 16,384 devices; without it the parts of a device depend only on its new and old
shard and the old shards on its node, and on the layers the old plan holds alike, so they are
found once per such combination and tensor kind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

from .plan import Plan, Stage
from .transfer_plan import ELEMENT_BYTES, KINDS, _changed, _Copies, _interval, _segments, extent, positions

# The last `inflow`'s old plan, live devices, copies and Inflow per (new shard, old shard, old
# shards on the node, kinds): what the parts depend on, not the device's id. A replan prices every
# candidate from the same plan.
_LAST: list = [None, None, None, None]


def forget_inflow() -> None:
    """Empty `inflow`'s memo (benchmarks/sched_latency.py: every timed replan starts cold)."""
    _LAST[:] = [None, None, None, None]


class Inflow(NamedTuple):
    """What one device receives, by where it comes from (bytes), and how many layers of its new
    stage it receives any tensor of."""

    node: int  # from a copy on its own node
    other: int  # from a copy on another node
    none: int  # rows no live device holds (the caller's `fallback`: a persisted snapshot)
    layers: int


def inflow(old: Plan, new: Plan, alive: Iterable[int], node_of: Callable[[int], int] | None = None,
           kinds: int = KINDS) -> dict[int, Inflow]:  # fmt: skip
    """receiver -> its `Inflow` under `plan_transfer(old, new, alive, node_of=node_of, kinds=kinds,
    fallback=...)`: the same parts from the same closest copies (`_segments`), without choosing
    among equally close senders (which one sends a part changes neither its bytes nor its link).
    The parts depend on the device's new and old shard and the old shards on its node, not on its
    id, so they are found once per such combination, in one pass per tensor kind and run of the
    layers the old plan holds alike (`_Copies.runs`)."""
    alive = set(alive)
    node = node_of or (lambda d: d)
    if _LAST[0] is not old or _LAST[1] != alive:
        _LAST[:] = [old, alive, _Copies(old, alive, {}), {}]
    copies, memo = _LAST[2], _LAST[3]
    changed = _changed(old, new, alive)
    nodes = {node(d) for d, _, _ in changed}
    was = {d: (st.layers, st.tp_split, st.ffn_split, r) for d, (st, r) in positions(old).items()
           if d in alive and node(d) in nodes}  # fmt: skip
    held: dict[int, set] = {}  # node -> the old shards its live devices hold
    for d, at in was.items():
        held.setdefault(node(d), set()).add(at)
    sigs = {n: frozenset(h) for n, h in held.items()}
    out: dict[int, Inflow] = {}
    for dev, st, r in changed:
        key = (st.layers, st.tp_split, st.ffn_split, r, was.get(dev), sigs.get(node(dev)), kinds)
        if key not in memo:
            memo[key] = _inflow_of(copies, st, r, key[4], key[5] or (), kinds)
        if memo[key] is not None:
            out[dev] = memo[key]
    return out


def _inflow_of(copies: _Copies, st: Stage, r: int, mine, on_node, kinds: int) -> Inflow | None:
    """The Inflow of TP rank `r` of `st` for a device that held the old shard `mine` (layers,
    tp_split, ffn_split, rank; None: nothing) on a node whose live devices hold `on_node`."""
    got, moved = [0, 0, 0], 0
    for k, count, names in copies.runs(st.layers):
        held = frozenset(h[1:] for h in on_node if h[0][0] <= k < h[0][1])
        keep = mine[1:] if mine and mine[0][0] <= k < mine[0][1] else None
        # A run's parts depend on its tensor kinds, the shards of the copies, the new shard and
        # the old shards at hand; not on which stages hold the copies, where it starts or its length.
        shards = copies.shards(copies.stages_at(k))
        key = (names[0], shards, st.tp_split, st.ffn_split, r, keep, held)
        per_layer = copies.by_run.get(key)
        if per_layer is None:
            per_layer = copies.by_run[key] = _run_parts(copies, k, names, shards, st, r, keep, held)
        if per_layer is not _NOTHING:
            per = ELEMENT_BYTES * kinds * count
            for j in range(3):
                got[j] += per_layer[j] * per
            if names[0].startswith("layers."):
                moved += count
    return Inflow(*got, moved) if any(got) else None


_NOTHING = (0, 0, 0)  # a run of which no tensor receives a row


def _run_parts(copies: _Copies, k: int, names, shards, st: Stage, r: int, keep, held) -> tuple[int, int, int]:
    """Elements of one layer of the run at layer `k` (its tensor kinds `names`, copies of
    `shards`) that rank `r` of `st` receives from its node, from another node and from no live
    copy, holding the shard `keep` itself and `held` on its node; `_NOTHING` when no tensor
    receives a row."""
    spec = copies.old.model
    out, any_rows = [0, 0, 0], False
    for kind in names:
        need = _interval(spec, kind, st.tp_split, st.ffn_split, r)
        own = _interval(spec, kind, *keep) if keep else None
        near = frozenset(_interval(spec, kind, *h) for h in held)
        # The parts depend on the copies' ranges, not on who holds them.
        key = (copies.spans(kind, shards), need, own, near)
        rows = copies.rows.get(key)
        if rows is None:
            parts = [0, 0, 0, 0]
            mine_c = [(*own, 0, 0)] if own else []
            near_c = [(a, b, 0, 0) for a, b in near]
            for x, y, where, _ in _segments(need, copies.of_key(copies.key_at(kind, k)), mine_c, near_c):
                parts[where] += y - x
            rows = copies.rows[key] = tuple(parts[1:])
        if any(rows):
            e = extent(spec, kind)[2]
            for j in range(3):
                out[j] += rows[j] * e
            any_rows = True
    return tuple(out) if any_rows else _NOTHING
