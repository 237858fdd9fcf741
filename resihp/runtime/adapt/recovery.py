"""Recovery from a fail-stop: the state the survivors hold, its live copies, the next generation's
plan, and what to tell the user when there is no way on.

Once a failure is quiescent (`control/failover.py`) the controller calls `plan_after_stop` and
publishes the plan as generation g+1 (docs/runtime.md, "What happens on a stop"). A job that cannot
go on ends with `WorkerFailed` (`lost_layers` names what no survivor holds); `advice` says what
the user can do about it.

`source_generation` is the generation whose committed state the survivors hold — the transfer
source of the next one. A member keeps what it held when it left each generation it joined; a
generation whose join failed (a death during the rebuild) was not joined by every survivor,
committed nothing, and its predecessor's holdings are still the committed state.
"""

from __future__ import annotations

from resihp.core.plan import Plan
from resihp.core.transfer_plan import cover_gaps
from resihp.sched.base import Policy
from resihp.sched.context import PlanningContext

from ..job import JobSpec, WorkerFailed
from ..state.snapshot import holders
from .reconfig import replan_after_stop
from .restart import Restart, plan_restart
from .rollback import Snapped, restore_point

SNAPSHOT_ADVICE = "run.snapshots = true keeps an in-memory copy of every stage on a peer; "


def plan_after_stop(
    ctx: PlanningContext,
    plans: list[Plan],
    joined: dict[int, set[int]],
    members: set[int],
    dead: list[int],
    it: int,
    job: JobSpec,
    policy: Policy | None,
    emit,
    pids: list[int],
    snapped: Snapped,
) -> tuple[Plan, str, tuple | Restart | None, int]:
    """The next generation's plan over the survivors `members` after `dead` stopped at iteration
    `it`, the policy's reason, its `source`: (generation, plan) whose held state the members
    transfer from, None to start from the seed / checkpoint, and the iteration it starts at: `it`,
    or earlier when the state comes from a checkpoint or a rollback (`rollback.restore_point`:
    the snapshots of `it` may be incomplete; `snapped` says which are complete).

    `ctx` is what the `policy` plans for (`reconfig.planning_context`), `plans` every generation's,
    `joined` generation -> members that completed its join. Every tensor must be covered by the
    live shards of the source state, across replicas and TP splits (`transfer_plan.cover_gaps`);
    with `job.snapshots` the snapshots of lost devices count (event `snapshot-restore`, handed to
    `emit`, when they are needed). Without a cover, the job restarts from its newest checkpoint
    (`restart.plan_restart`: the source is then a `Restart`), else WorkerFailed (carrying `pids`)
    naming the layers no survivor holds; WorkerFailed too when no plan runs on the survivors (every
    replica lost a stage and the policy has no answer).
    """
    # the state survivors hold: of cur, or of an earlier generation when cur's rebuild failed
    src = source_generation([p.devices() for p in plans], joined, members)
    base, start = plans[0] if src is None else plans[src], it
    if src is not None:  # (None: start from the seed / checkpoint)
        hold = holders(base) if job.snapshots else {}
        got = joined.get(src, set())
        start, copies, gaps = restore_point(base, members, hold, snapped, src, it, got, job.snapshots)
        if start is None:  # no complete cover, even with the snapshots: the newest checkpoint, if any
            keep = "" if job.snapshots else SNAPSHOT_ADVICE
            failed = WorkerFailed(
                f"devices {dead} stopped at iteration {it} and took out every copy of "
                f"{lost_layers(base, members, copies) or gaps[0]} ({keep}with checkpoints the job "
                "restarts from the newest)",
                dead,
                pids,
            )
            new, reason, point = plan_restart(ctx, base, members, it, job, policy, emit, failed)
            return new, reason, point, point.iteration
        if copies:
            lost = sorted(d for d in base.devices() if d not in members)
            devices = sorted(set(copies.values()))
            emit({"iter": it, "kind": "snapshot-restore", "devices": devices, "lost": lost, "to_iter": start})
    try:
        new, reason = replan_after_stop(ctx, base, members, policy, absorb=job.snapshots)
    except ValueError as e:  # no plan over the survivors (`shrink_plan`: every replica lost a stage)
        raise WorkerFailed(f"devices {dead} stopped at iteration {it}: {e}", dead, pids) from None
    return new, reason, None if src is None else (src, base), start


def source_generation(
    plan_devices: list[tuple[int, ...]], joined: dict[int, set[int]], members
) -> int | None:
    """The latest generation g (index into `plan_devices`, g's plan devices) such that every surviving
    plan device of g (at least one) joined it; None when there is none (start from the seed or the
    checkpoint again). Monotone in time: `joined` only grows and survivors only shrink."""
    members = set(members)
    for g in range(len(plan_devices) - 1, -1, -1):
        live = set(plan_devices[g]) & members
        if live and live <= joined.get(g, set()):
            return g
    return None


def lost_layers(plan: Plan, members, snapshots: dict[int, int] | None = None) -> str:
    """The layers of `plan` some tensor of which the shards on `members` (and the `snapshots` of
    lost devices: device -> holder) no longer cover, as ranges: "layers 2-3", "layers 0-1, 6"
    ("" when every layer is covered; the embedding counts as layer 0, the head as the last)."""
    spec = plan.model
    lost = sorted({
        int(n.split(".")[1]) if n.startswith("layers.") else 0 if n == "embed.weight" else spec.num_layers - 1
        for n in cover_gaps(plan, members, snapshots)
    })  # fmt: skip
    runs: list[list[int]] = []
    for k in lost:
        if runs and runs[-1][1] == k - 1:
            runs[-1][1] = k
        else:
            runs.append([k, k])
    if not runs:
        return ""
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)
    return f"layer{'s' if len(runs) > 1 or runs[0][0] != runs[0][1] else ''} {text}"


def advice(job: JobSpec, events: list[dict], failed: bool = True) -> str:
    """What the user can do about a job that stopped early: resume from the newest checkpoint (one
    this run wrote, else the one it resumed from); without one, for a job that `failed`, rerun with
    checkpoints ("" for an interrupted one: there is nothing to add)."""
    saved = [e for e in events if e["kind"] == "checkpoint"]
    if saved:
        return (
            f"the checkpoint at iteration {saved[-1]['iter']} keeps the state: resume with "
            f"`resihp train --resume {job.checkpoint_dir}` (same --config)"
        )
    if job.resume is not None:
        return (
            f"the checkpoint at iteration {job.start_iteration} keeps the state: resume with "
            f"`resihp train --resume {job.resume}` (same --config)"
        )
    if not failed:
        return ""
    return "no checkpoint: rerun with --checkpoint-every N --checkpoint-dir DIR to be able to resume"


def mark_noticed(events: list[dict], noticed: dict[int, dict[int, str]]) -> None:
    """Annotate the first fail-stop event that ended each generation g with how every member saw the
    failure (`noticed`: g -> device -> the error its `Abort` carried)."""
    for g, seen in noticed.items():
        stop = next((e for e in events if e["kind"] == "fail-stop" and e["generation"] == g), None)
        if stop is not None:
            stop["noticed"] = {d: seen[d] for d in sorted(seen)}
