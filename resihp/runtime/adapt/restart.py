"""The way on when in-place recovery is impossible: the job restarts itself from its newest complete
checkpoint on the surviving devices, instead of ending.

A fail-stop that takes out every copy of some shard (no live cover, no snapshot: `recovery.py`)
leaves no state to transfer. If the run has a usable checkpoint — the newest intact one in
`run.checkpoint_dir` (`state.verify.newest_usable`, with its fallback), else the one it resumed
from — the scheduler plans over the survivors as usual (`reconfig.replan_after_stop`; dead stages
may be absorbed by neighbours, since no state has to be found in place) and the controller
publishes that plan as the next generation with `Generation.restore` = the checkpoint: every member
loads its new stage from it (DCP reshards to the new plan) and the job re-runs the iterations from
the checkpoint's on (`rewind`, the one rewind point, shared with the rollback by one iteration of
`rollback.py`). The re-run iterations are the same pure function of the committed
state and the data as the first time, so the loss trajectory still equals the fault-free run's.
Only when there is no usable checkpoint does the job end (`WorkerFailed`, one line).
"""

from __future__ import annotations

from dataclasses import dataclass

from resihp.core.plan import Plan
from resihp.sched.base import Policy
from resihp.sched.context import PlanningContext

from ..job import JobSpec, WorkerFailed
from ..state.verify import check_model, newest_usable
from .reconfig import replan_after_stop


@dataclass(frozen=True)
class Restart:
    """Restart from the checkpoint at `path`, which holds the state committed before `iteration`."""

    path: str
    iteration: int


def restart_point(job: JobSpec, it: int) -> Restart | None:
    """The newest usable checkpoint of this run's model from before iteration `it` (a checkpoint
    directory may hold newer ones of an earlier run): in `job.checkpoint_dir`, else the one the run
    resumed from; None when there is none. Damaged ones skipped are named in one warning line."""
    for where in (job.checkpoint_dir, job.resume):
        if where is None:
            continue
        try:
            path, meta = newest_usable(where, "restart", at_most=it)
            check_model(meta, job.spec, f"restart {path}")
        except (OSError, ValueError):
            continue
        return Restart(path, meta["iteration"])
    return None


def plan_restart(
    ctx: PlanningContext,
    base: Plan,
    members: set[int],
    it: int,
    job: JobSpec,
    policy: Policy | None,
    emit,
    failed: WorkerFailed,
) -> tuple[Plan, str, Restart]:
    """(plan over the survivors `members`, the reason, the `Restart`) once the failure `failed`
    (what the job would end with) left no live copy of some shard at iteration `it`; raises
    `failed` when the run has no usable checkpoint or no plan runs on the survivors."""
    point = restart_point(job, it)
    if point is None:
        raise failed
    try:
        new, reason = replan_after_stop(ctx, base, members, policy, absorb=True)
    except ValueError as e:
        raise WorkerFailed(f"{failed}; no plan for a restart: {e}", failed.devices, failed.pids) from None
    emit({"iter": it, "kind": "restart", "checkpoint": point.path, "to_iter": point.iteration,
          "devices": new.devices()})  # fmt: skip
    return new, f"restart from the checkpoint at iteration {point.iteration}: {reason}", point


def rewind(ctrl, iteration: int) -> None:
    """The one rewind point: set the controller back to `iteration`, where the next generation
    starts (a checkpoint's, or a rollback's: `rollback.py`); the iterations from it on run again
    (their records, streamed ones included, and `Reached` messages so far are dropped; the data
    position and RNG are functions of the iteration, the members' optimizer step count of the
    generation's start)."""
    ctrl.records.rewind(iteration)
    ctrl.reached, ctrl.it = {}, iteration
