"""Every process group a device needs for one Plan generation, built in one place, destroyed whole.

Ranks: the world of generation g is the plan's devices in ascending id order; a device's rank is
its index there (`device_ranks`). Groups built (gloo requires *every* rank to call `new_group` for
*every* group, in the same order, so the list below is a pure function of the Plan):

* TP group of each non-hollow stage with tp >= 2 (Megatron f/g collectives inside F/B, and the
  broadcast of a received activation/gradient from the group's root).
* Gradient-reduction groups, one per device set a gradient segment reduces over
  (`resihp.core.segments`: the rule, shared with the compiler, the cost model and the
  simulator): the devices of equal TP rank of a sharded segment's holders, or every holder
  device of a full one. The worker reduces exactly the segments its ALLREDUCE instruction names,
  each over `Groups.reduction_group(segment)`.
* With tied embeddings, every holder of the embedding or the LM head
  (`segments.tied_embedding_devices`): the sum that gives both copies the same gradient at STEP.
* With `step=True` (gradient clipping on) and standby members in the world: the plan's devices
  (`Groups.step_group`, the all-reduce of the global gradient norm at STEP; without standby
  members it is the world).

P2P (SEND/RECV) uses the default group with global ranks (`Groups.rank_of`).
No module-level state: a `Groups` is passed explicitly and `destroy()`ed when the Plan
changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import torch.distributed as dist

from resihp.core.plan import Plan
from resihp.core.segments import GradSegment, grad_segments, tied_embedding_devices


def device_ranks(plan: Plan) -> dict[int, int]:
    """device id -> global rank of this generation's world (standby devices are not in it)."""
    return {dev: r for r, dev in enumerate(plan.devices())}


def _group_device_sets(plan: Plan, world=None) -> list[tuple[int, ...]]:
    """Every device set that needs a group, deduplicated, in a deterministic order (`world`: the
    generation's devices, when it holds more than the plan's)."""
    sets: list[tuple[int, ...]] = []
    for stages in plan.replicas:
        for st in stages:
            if st.tp >= 2:
                sets.append(tuple(sorted(st.devices)))
    for seg in grad_segments(plan):
        sets += seg.rank_sets() if seg.sharded else [seg.devices]
    sets.append(tied_embedding_devices(plan))
    if world is not None and set(world) != set(plan.devices()):
        sets.append(tuple(plan.devices()))
    return list(dict.fromkeys(s for s in sets if len(s) >= 2))


@dataclass
class Groups:
    """The process groups of one device for one Plan generation."""

    plan: Plan
    device: int
    ranks: dict[int, int]  # device -> global rank
    tp_group: object | None  # None when the stage has tp == 1
    tp_rank: int
    made: dict[tuple[int, ...], object] = field(default_factory=dict)  # device set -> group (mine)
    _owned: list = field(default_factory=list, repr=False)

    @property
    def step_group(self):
        """The group of every plan device: None for the default group, when the world is the plan
        (a one-device plan reduces nothing)."""
        devices = tuple(self.plan.devices())
        if set(self.ranks) == set(devices):
            return None
        assert devices in self.made, "build_groups(..., step=True) makes the plan's group"
        return self.made[devices]

    @property
    def tie_group(self):
        """The group summing the tied embedding's gradients (None: this device holds them alone)."""
        return self.made.get(tied_embedding_devices(self.plan))

    def reduction_group(self, segment: GradSegment):
        """The group this device all-reduces `segment` in; None when it holds the segment alone."""
        return self.made.get(segment.reduce_set(self.device))

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
        self.made = {}


def build_groups(
    plan: Plan,
    device: int,
    ranks: dict[int, int] | None = None,
    timeout: timedelta | None = None,
    step: bool = False,
) -> Groups:
    """All groups of `device` under `plan`; must be called by every rank of the world together.
    `timeout` bounds each group's rendezvous and operations (default: torch's, 30 min for gloo);
    `step`: also the group of the plan's devices (`Groups.step_group`; every rank passes the same).

    `ranks` (default `device_ranks(plan)`): device -> global rank when the world also holds devices
    outside the plan (standby workers of the elastic runtime); such a device creates every group
    with the others and gets a `Groups` with no stage (tp_rank -1).
    """
    ranks = device_ranks(plan) if ranks is None else ranks
    world = ranks if step else None
    where = plan.stage_of(device)
    if where is None:
        for devs in _group_device_sets(plan, world):
            dist.new_group([ranks[x] for x in devs], timeout=timeout)
        return Groups(plan=plan, device=device, ranks=ranks, tp_group=None, tp_rank=-1)
    d, i = where
    stage = plan.replicas[d][i]
    made: dict[tuple[int, ...], object] = {}
    owned = []
    for devs in _group_device_sets(plan, world):
        pg = dist.new_group([ranks[x] for x in devs], timeout=timeout)
        if device in devs:
            made[devs] = pg
            owned.append(pg)
    tp_group = made[tuple(sorted(stage.devices))] if stage.tp >= 2 else None
    return Groups(
        plan=plan,
        device=device,
        ranks=ranks,
        tp_group=tp_group,
        tp_rank=stage.devices.index(device),
        made=made,
        _owned=owned,
    )
