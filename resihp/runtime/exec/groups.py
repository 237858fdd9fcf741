"""Every process group a device needs for one Plan generation, built in one place, destroyed whole.

Ranks: the world of generation g is the plan's devices in ascending id order; a device's rank is
its index there (`device_ranks`). Groups built (gloo requires *every* rank to call `new_group` for
*every* group, in the same order, so the list below is a pure function of the Plan):

* TP group of each non-hollow stage with tp >= 2 (Megatron f/g collectives inside F/B, and the
  broadcast of a received activation/gradient from the group's root).
* Gradient-reduction groups, per *layer segment*: the layer axis is cut at every stage boundary
  of every replica (`grad_segments`). When every stage holding a segment has the same TP split
  (the usual case) the devices of equal TP rank form a DP group and reduce their shards (after a
  TP sum of the partial norm / replicated-kv entries). Otherwise the segment's group is every
  device holding it, and one all-reduce of gradients laid out in the full (unsharded) layout sums
  TP partials and DP replicas at once — whatever the replicas' TP splits or layer partitions.
  The embedding travels with the segment that starts at layer 0, the final norm and LM head with
  the one that ends at the last layer.

P2P (SEND/RECV) uses the default group with global ranks (`Groups.rank_of`).
No module-level state: a `Groups` is passed explicitly and `destroy()`ed when the Plan
changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import torch.distributed as dist

from resihp.core.plan import Plan, Stage


def device_ranks(plan: Plan) -> dict[int, int]:
    """device id -> global rank of this generation's world (standby devices are not in it)."""
    return {dev: r for r, dev in enumerate(plan.devices())}


@dataclass(frozen=True)
class GradSegment:
    """Layers [lo, hi) and the non-hollow stages (of all replicas) that hold them.

    `aligned`: every such stage has the same (tp_split, ffn_split), so gradients can be reduced
    shard by shard: the devices of equal TP rank form one DP group (`rank_sets`), after a TP sum
    of the partial entries. Otherwise all of `devices` reduce in the full layout.
    """

    layers: tuple[int, int]
    stages: tuple[Stage, ...]

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(sorted(dev for st in self.stages for dev in st.devices))

    @property
    def aligned(self) -> bool:
        return len({(st.tp_split, st.ffn_split) for st in self.stages}) == 1

    def rank_sets(self) -> list[tuple[int, ...]]:
        """Per TP rank r: the devices of rank r in every stage (only when aligned)."""
        return [tuple(sorted(st.devices[r] for st in self.stages)) for r in range(self.stages[0].tp)]


def grad_segments(plan: Plan) -> list[GradSegment]:
    """The layer axis cut at every stage boundary of every replica, in layer order."""
    cuts = sorted({b for stages in plan.replicas for st in stages for b in st.layers})
    return [
        GradSegment(
            (lo, hi),
            tuple(
                st
                for stages in plan.replicas
                for st in stages
                if not st.hollow and st.layers[0] <= lo and hi <= st.layers[1]
            ),
        )
        for lo, hi in zip(cuts, cuts[1:])
    ]


def _group_device_sets(plan: Plan) -> list[tuple[int, ...]]:
    """Every device set that needs a group, deduplicated, in a deterministic order."""
    sets: list[tuple[int, ...]] = []
    for stages in plan.replicas:
        for st in stages:
            if st.tp >= 2:
                sets.append(tuple(sorted(st.devices)))
    for seg in grad_segments(plan):
        sets += seg.rank_sets() if seg.aligned else [seg.devices]
    return list(dict.fromkeys(s for s in sets if len(s) >= 2))


@dataclass
class Groups:
    """The process groups of one device for one Plan generation."""

    plan: Plan
    device: int
    ranks: dict[int, int]  # device -> global rank
    tp_group: object | None  # None when the stage has tp == 1
    tp_rank: int
    # [((lo, hi), aligned, group or None when alone)] for the segments this device's stage covers;
    # aligned: the group is this TP rank's DP group (shard reduction), else the full-layout group
    segments: list[tuple[tuple[int, int], bool, object | None]] = field(default_factory=list)
    _owned: list = field(default_factory=list, repr=False)

    def rank_of(self, replica: int, stage: int, tp_rank: int = 0) -> int:
        """Global rank of TP rank `tp_rank` of (replica, stage)."""
        return self.ranks[self.plan.replicas[replica][stage].devices[tp_rank]]

    def set_timeout(self, timeout: timedelta) -> None:
        """Set the operation timeout of every group this object created (they were built with the
        short rendezvous timeout of a generation change, `member.JOIN_TIMEOUT_S`)."""
        for pg in self._owned:
            dist.distributed_c10d._set_pg_timeout(timeout, pg)

    def destroy(self) -> None:
        """Destroy every group this object created (call on every rank, before the next generation)."""
        for pg in self._owned:
            dist.destroy_process_group(pg)
        self._owned.clear()
        self.tp_group = None
        self.segments = []


def build_groups(
    plan: Plan, device: int, ranks: dict[int, int] | None = None, timeout: timedelta | None = None
) -> Groups:
    """All groups of `device` under `plan`; must be called by every rank of the world together.
    `timeout` bounds each group's rendezvous and operations (default: torch's, 30 min for gloo).

    `ranks` (default `device_ranks(plan)`): device -> global rank when the world also holds devices
    outside the plan (standby workers of the elastic runtime); such a device creates every group
    with the others and gets a `Groups` with no stage (tp_rank -1).
    """
    ranks = device_ranks(plan) if ranks is None else ranks
    where = plan.stage_of(device)
    if where is None:
        for devs in _group_device_sets(plan):
            dist.new_group([ranks[x] for x in devs], timeout=timeout)
        return Groups(plan=plan, device=device, ranks=ranks, tp_group=None, tp_rank=-1)
    d, i = where
    stage = plan.replicas[d][i]
    made: dict[tuple[int, ...], object] = {}
    owned = []
    for devs in _group_device_sets(plan):
        pg = dist.new_group([ranks[x] for x in devs], timeout=timeout)
        if device in devs:
            made[devs] = pg
            owned.append(pg)
    tp_group = made[tuple(sorted(stage.devices))] if stage.tp >= 2 else None
    lo, hi = stage.layers
    rank = stage.devices.index(device)
    segments = []
    for seg in grad_segments(plan):
        if lo <= seg.layers[0] and seg.layers[1] <= hi:
            devs = seg.rank_sets()[rank] if seg.aligned else seg.devices
            segments.append((seg.layers, seg.aligned, made.get(devs)))
    return Groups(
        plan=plan,
        device=device,
        ranks=ranks,
        tp_group=tp_group,
        tp_rank=rank,
        segments=segments,
        _owned=owned,
    )
