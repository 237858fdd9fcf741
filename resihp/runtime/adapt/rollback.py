"""Rollback by one iteration: the newest committed state the survivors and the snapshots cover.

The snapshot exchange is off the critical path (`state/snapshot.py`): the snapshots of the state
committed before iteration t (tag t) are exchanged while t computes, and a member waits for its
exchange only at t's STEP, before it reports `Reached`, at the start of a generation, before its
first iteration, and when it leaves a failed iteration, before it reports `Abort`. So the members'
reports tell the controller which snapshots are complete (`Snapped.certify`, the one place that
learns it):

* tag t of generation g is complete at a member of g once it reported `Reached` for t in g, or
  an `Abort` of g naming t (`Abort.snapshot`: the newest tag it holds complete), or when t is g's
  start (its join waited for that exchange);
* every tag up to the last iteration committed in g is complete at every plan device of g.

A death while t computes can thus leave a lost device's tag-t snapshot incomplete: its holder never
reached t's STEP (the pipeline needs the lost stage), and its exchange of t failed (the lost device
died before its copy arrived), so its `Abort` names t - 1. When the exchange completed before the
death — the usual case: it runs while t computes — the holder's `Abort` names t and the recovery
starts from t itself, nothing re-run. Every member keeps, of each generation it
leaves (`member.held`), its worker's state at the iteration it left at (L) and, with snapshots, the
two newest complete tags (its own shard's copy and the snapshots it holds; `snapshot.Keeper`). The
recovery (`recovery.plan_after_stop`) takes the newest of L, L - 1 (not before the generation's
start, not after the controller's next iteration) whose state the survivors' own shards and the
complete snapshots of the lost devices cover; L - 1 is a rollback: the controller re-runs the
iterations from it (`restart.rewind`, the one rewind point: records, the next iteration, and with
it the data position and RNG, which are functions of the iteration). Torch-free.
"""

from __future__ import annotations

from resihp.core.plan import Plan
from resihp.core.transfer_plan import cover_gaps


class Snapped:
    """What the controller knows of the snapshots each generation's members keep. `bodies`: the
    controller's published generations (their start iterations)."""

    def __init__(self, bodies: dict) -> None:
        self.bodies = bodies
        self.left: dict[int, int] = {}  # generation -> the iteration a failure ended it at
        self.reached: dict[int, dict[int, int]] = {}  # generation -> device -> newest tag certified

    def certify(self, generation: int, device: int, tag: int) -> None:
        """`device` holds the complete snapshots of `tag` (and keeps the one before) in
        `generation`: it reported `Reached` for `tag` (its STEP waited for that exchange) or an
        `Abort` naming `tag` (the newest exchange it completed)."""
        got = self.reached.setdefault(generation, {})
        got[device] = max(got.get(device, tag), tag)

    def leave(self, generation: int, it: int) -> None:
        """A failure ended `generation` while `it` was in flight (the first one counts)."""
        self.left.setdefault(generation, it)

    def last(self, generation: int, it: int) -> int:
        """The iteration the members left `generation` at: a failure's, else the next generation's
        start (`it` for the current one); every iteration before it was committed there."""
        if generation in self.left:
            return self.left[generation]
        return self.bodies[generation + 1].start if generation + 1 in self.bodies else it

    def points(self, generation: int, it: int, snapshots: bool) -> list[int]:
        """The iterations whose committed state the members of `generation` keep, newest first: the
        one they left at and, with `snapshots`, the one before; none before its start or after `it`."""
        start, last = self.bodies[generation].start, self.last(generation, it)
        return [t for t in (last, last - 1)[: 2 if snapshots else 1] if start <= t <= it]

    def complete(self, generation: int, t: int, device: int, joined, it: int) -> bool:
        """Whether `device` (a member that completed the join of `generation`: `joined`) holds the
        complete snapshots of tag `t` there: `t` is its start, or `device` certified t or a later
        tag (`certify`: it reached t's STEP — every device did for a committed t — or its `Abort`
        named it)."""
        got = self.reached.get(generation, {}).get(device, -1)
        committed = t < self.last(generation, it)
        return device in joined and (t == self.bodies[generation].start or committed or got >= t)


def restore_point(
    base: Plan, members: set[int], hold: dict[int, int], snapped: Snapped, generation: int, it: int,
    joined, snapshots: bool,
) -> tuple[int | None, dict[int, int], list[str]]:  # fmt: skip
    """(t, copies, gaps) for the state of `generation` (plan `base`) the survivors `members` start
    the next generation from: the newest of `snapped.points` whose rows their own shards cover,
    with the complete snapshots of lost devices where needed (`copies`: lost device -> the member
    keeping its snapshot; `hold` = `snapshot.holders(base)`, empty without snapshots). t None when
    no point is covered; `gaps`: then what the last point tried lacks."""
    lost = [d for d in base.devices() if d not in members]
    copies: dict[int, int] = {}
    gaps = [f"the state committed before iteration {it}"]
    for t in snapped.points(generation, it, snapshots):
        if not cover_gaps(base, members):
            return t, {}, []
        complete = [d for d in lost if snapped.complete(generation, t, hold.get(d), joined, it)]
        copies = {d: hold[d] for d in complete if hold.get(d) in members}
        gaps = cover_gaps(base, members, copies)
        if not gaps:
            return t, copies, []
    return None, copies, gaps
