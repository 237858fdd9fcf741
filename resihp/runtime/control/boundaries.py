"""Plan changes due at iteration boundaries: planned replans, fail-slow replans, re-joining devices.

Torch-free; the controller (`controller.py`) asks `at(k)` when it commits iteration k − 1 and, when
a plan change is due, publishes generation g+1 starting at k and writes `next` (docs/runtime.md,
"Commit protocol"). Three sources:

* planned replans, `(iteration, plan)` given to `launch_elastic`;
* fail-slow replans (`propose`): a `fail-slow` / `link-slow` report decided by the scheduler while
  generation g runs takes effect at the next boundary. A later report re-decides it; one decided
  before a fail-stop (in an older generation) is stale and dropped. It never displaces a planned
  replan due at the same boundary;
* re-joins: the devices of every `rejoin` fault, iteration-keyed from the start or resolved from
  time at a commit (`add_rejoin`); the controller spawns fresh processes for those that are not
  members and grows the plan back (`reconfig.grow_plan`).
"""

from __future__ import annotations

from collections.abc import Iterable

from resihp.core.plan import Plan


class Boundaries:
    """`replans`: iteration -> the plan that runs from it; `why`: iteration -> (reason, generation)
    of a fail-slow replan; `rejoins`: iteration -> devices that re-join at it. No fail-slow replan
    is scheduled at or past `end` (it would never run)."""

    def __init__(self, replans: Iterable[tuple[int, Plan]], faults: Iterable, end: int) -> None:
        self.replans: dict[int, Plan] = {it: p for it, p in replans}
        self.why: dict[int, tuple[str, int]] = {}  # iteration -> (reason, generation) of a fail-slow replan
        self.rejoins: dict[int, list[int]] = {}
        self.end = end
        for f in faults:
            if f.kind == "rejoin":
                self.add_rejoin(f)

    def add_rejoin(self, fault) -> None:
        """An (iteration-keyed) `rejoin` fault: its device re-joins at `fault.at_iter`."""
        self.rejoins.setdefault(fault.at_iter, []).append(fault.device)

    def propose(self, at: int, new: Plan | None, reason: str, generation: int) -> str:
        """A fail-slow replan `new` (None: no usable plan), decided in `generation` with `reason`, to
        run from iteration `at`; returns the reason the slow events carry."""
        if new is not None and at < self.end and (at not in self.replans or at in self.why):
            self.replans[at], self.why[at] = new, (reason, generation)  # a later report re-decides
            return f"replan at iteration {at}: {reason}"
        if new is not None:
            return f"no replan (the run ends or another replan is due): {reason}"
        return reason

    def at(self, at: int, generation: int, members: set[int]) -> tuple[Plan | None, str, list[int]]:
        """What changes at iteration `at`, seen from the current `generation` and its `members`: the
        plan due (None: none), its reason, and the re-joining devices that are not members."""
        if at in self.why and self.why[at][1] != generation:  # decided before a fail-stop: stale
            del self.replans[at], self.why[at]
        joiners = [d for d in self.rejoins.get(at, []) if d not in members]
        # (`why` holds only iterations that `replans` holds: with no plan due, the reason is unused)
        return self.replans.get(at), self.why.pop(at, ("planned",))[0], joiners
