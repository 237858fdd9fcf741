"""Recovery from a fail-stop: the state the survivors hold, its live copies, the next generation's plan.

The controller (`controller.py`) calls `plan_after_stop` once the dead members are out of
`members`, publishes the plan as generation g+1 and aborts the iteration in flight; `close_recovery`
annotates the fail-stop event once that iteration is committed (docs/runtime.md, "What happens on a
stop", "Recovery times").

`source_generation` is the generation whose committed state the survivors hold — the transfer
source of the next one. A member keeps what it held when it left each generation it joined; a
generation whose join failed (a death during the rebuild) was not joined by every survivor,
committed nothing, and its predecessor's holdings are still the committed state.
"""

from __future__ import annotations

import time

from resihp.core.plan import Plan
from resihp.sched.base import Policy
from resihp.sched.context import PlanningContext

from ..job import JobSpec, WorkerFailed
from ..state.snapshot import holders
from ..state.transfer import source_stages
from .reconfig import replan_after_stop


def plan_after_stop(
    ctx: PlanningContext,
    plans: list[Plan],
    joined: dict[int, set[int]],
    members: set[int],
    dead: list[int],
    it: int,
    job: JobSpec,
    policy: Policy | None,
    events: list[dict],
    pids: list[int],
) -> tuple[Plan, str, tuple | None]:
    """The next generation's plan over the survivors `members` after `dead` stopped at iteration
    `it`, the policy's reason, and its `source`: (generation, plan) whose held state the members
    transfer from, None to start from the seed / checkpoint.

    `ctx` is what the `policy` plans for (`reconfig.planning_context`), `plans` every generation's,
    `joined` generation -> members that completed its join. Every tensor must have a complete live
    copy in the source state (`transfer.source_stages`); with `job.snapshots` a lost stage's
    snapshot holders count (event `snapshot-restore`, appended to `events`), else WorkerFailed
    (carrying `pids`).
    """
    # the state survivors hold: of cur, or of an earlier generation when cur's rebuild failed
    src = source_generation([p.devices() for p in plans], joined, members)
    base = plans[0] if src is None else plans[src]
    try:
        if src is not None:  # (None: nothing joined yet, start from the seed / checkpoint)
            source_stages(base, members)
    except ValueError as e:  # a stage lost every replica: its snapshots, else WorkerFailed
        if not job.snapshots:
            raise WorkerFailed(
                f"devices {dead} stopped at iteration {it} and the job cannot go on: {e} "
                "(run.snapshots = true keeps an in-memory copy of every stage on a peer)",
                dead,
                pids,
            ) from None
        hold = holders(base)
        source_stages(base, members, hold)
        lost = sorted(d for d in base.devices() if d not in members)
        used = sorted({hold[d] for d in lost if d in hold})
        events.append({"iter": it, "kind": "snapshot-restore", "devices": used, "lost": lost})
    new, reason = replan_after_stop(ctx, base, members, policy, absorb=job.snapshots)
    return new, reason, None if src is None else (src, base)


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


def close_recovery(rec: dict, events: list[dict], joined: dict) -> None:
    """Annotate the last fail-stop event with the kill -> first committed iteration breakdown;
    `joined`: generation -> its members' `Joined` messages (their seconds, the slowest member's)."""
    got = joined.get(rec["gen"], [])
    stop = next(e for e in reversed(events) if e["kind"] == "fail-stop")
    stop["recovery"] = {
        "kill_to_commit_s": time.time() - rec["t_stop"],
        "detect_s": rec["detect_s"],
        "plan_s": rec["plan_s"],
        **{
            k: max((getattr(m, k) for m in got), default=0.0)
            for k in ("teardown_s", "group_s", "transfer_s", "build_s")
        },
    }


def mark_noticed(events: list[dict], noticed: dict[int, dict[int, str]]) -> None:
    """Annotate the first fail-stop event that ended each generation g with how every member saw the
    failure (`noticed`: g -> device -> the error its `Abort` carried)."""
    for g, seen in noticed.items():
        stop = next((e for e in events if e["kind"] == "fail-stop" and e["generation"] == g), None)
        if stop is not None:
            stop["noticed"] = {d: seen[d] for d in sorted(seen)}
