"""The controller's side of member failures: abort at once, replan once the failure is quiescent.

When a member dies, the controller (`controller.py`) opens a `Failure` (`Failover.lose`): it writes
`Gate.ABORT` for every generation still before its rendezvous and `Verdict.ABORT` for the
iteration in flight at once, so that every survivor leaves the failed generation g — by a failed
collective, a peer's closed sockets, or the aborted decision at its STEP — and reports `Abort`.
Further deaths join the open failure. It replans only once the failure is *quiescent*
(`Failover.quiescent`): every live member of g reported its `Abort` or provably touches none of
g's groups any more. A member that dies together with the first one (two devices stopped at
once) never reports, so the failure stays open until its death is seen too, however late the
machine's load makes it: the plan is made from a consistent set of survivors, no fixed wait
decides it. A hung member is bounded by its heartbeat timeout (it is killed: a death). The
generation's members need no new message for this: `Abort`, `Joining` and `Joined` say it.

`Failover` also keeps the recovery measurement (`replanned` starts it, `committed` ends it with the
re-run iteration's commit: `close_recovery`) and the aborts reported while no process
died (`unexplained`: the controller fails the job after a grace). Torch-free.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .protocol import Decision, Gate, Verdict

ABORT_GRACE_S = 5.0  # a reported collective failure with no dead process after this -> WorkerFailed


@dataclass
class Failure:
    """A failure not replanned yet: generation `generation` lost `dead` (in order); `t_detect`:
    wall-clock time the controller saw the first death."""

    generation: int
    t_detect: float
    dead: list[int] = field(default_factory=list)


def at_rest(
    members, plan_devices, *, gated_off: bool, aborted=(), joined=(), arrived=(), starting=()
) -> bool:
    """Whether every live member (`members`) of a failed generation is at rest, so that no further
    death of this failure can come unseen:

    * the generation never got `go` (`gated_off`): no member touches its groups; a member is at rest
      once it `arrived` at its barrier (it waits on the gate) or while it is `starting` (a fresh
      process that reached no barrier yet: not part of this failure);
    * it got `go`: a member is at rest once it reported an `Abort` of it (`aborted`), or it is a
      standby member (not in `plan_devices`) that completed its join (`joined`), after which it does
      nothing in the generation.

    A member neither dead nor at rest is on its way to its abort (the rest of its compute up to a
    collective or its STEP: 0.15-0.25 s on the default job), about to die too, or hung (its
    heartbeat timeout kills it)."""
    rest = set(arrived) | set(starting) if gated_off else set(aborted) | (set(joined) - set(plan_devices))
    return set(members) <= rest


class Failover:
    """`open`: the `Failure` not replanned yet; `measured`: the recovery being measured, from the
    first stop of a failure (or of the one before, not recovered yet when this one came) until the
    re-run iteration commits; `noticed`: generation -> device -> the error of its `Abort`;
    `aborts`, `abort_since`: failed collectives reported in the current generation while no
    failure is open, and since when. `board`, `barrier`: the controller's; `snapped`: which
    snapshots are complete (`adapt/rollback.Snapped`; a failure ends a generation there)."""

    def __init__(self, board, barrier, snapped) -> None:
        self.board, self.barrier, self.snapped = board, barrier, snapped
        self.open: Failure | None = None
        self.measured: dict | None = None
        self.noticed: dict[int, dict[int, str]] = {}
        self.aborts: dict[int, str] = {}
        self.abort_since: float | None = None

    def lose(self, generation: int, it: int, dead: list[int]) -> bool:
        """Members `dead` of `generation` died while `it` was in flight; True when this opens a
        failure, which aborts at once `go` of every generation still before its rendezvous and
        the decision on `it`."""
        opens = self.open is None
        if opens:
            self.open = Failure(generation, time.time())
            self.aborts, self.abort_since = {}, None
            for g in self.barrier.supersede(generation + 1):  # generations still before their rendezvous
                self.board.gate(g, Gate.ABORT)
            self.board.decide(generation, it, Decision(Verdict.ABORT))
            self.snapped.leave(generation, it)
        self.open.dead += dead
        return opens

    def quiescent(self, members: set[int], plans: list, joined: dict[int, set[int]]) -> bool:
        """The open failure is quiescent (`at_rest`); `plans`: every generation's, `joined`:
        generation -> the members that completed its join."""
        g, barrier = self.open.generation, self.barrier
        return at_rest(
            members,
            plans[g].devices(),
            gated_off=barrier.verdict.get(g) is Gate.ABORT,
            aborted=self.noticed.get(g, {}),
            joined=joined.get(g, set()),
            arrived=barrier.arrived.get(g, set()),
            starting=set(members) - barrier.seen,
        )

    def abort(self, generation: int, device: int, error: str, current: int, snapshot: int | None) -> None:
        """A member reported an `Abort` of `generation` (`current`: the latest published); it holds
        the complete snapshots of tag `snapshot` there (None: no snapshots)."""
        if snapshot is not None:
            self.snapped.certify(generation, device, snapshot)
        self.noticed.setdefault(generation, {})[device] = error[:200]
        if generation == current and self.open is None:  # (an open failure: its abort is written)
            self.aborts[device] = error
            self.abort_since = self.abort_since or time.monotonic()

    def unexplained(self, grace_s: float = ABORT_GRACE_S) -> dict[int, str]:
        """The failed collectives of the current generation when no process died within `grace_s`
        of the first (device -> what to blame it for; empty otherwise)."""
        late = self.abort_since is not None and time.monotonic() - self.abort_since > grace_s
        why = "reported a failed collective, no process died"
        return {d: f"{why}: {e}" for d, e in self.aborts.items()} if late else {}

    def replanned(self, stopping: dict[int, float], plan_s: float, generation: int) -> None:
        """The open failure was replanned (in `plan_s`, just now) as `generation`; `stopping`: device
        -> the wall-clock time its member stopped (its own word, or silent since)."""
        f, self.open = self.open, None
        t_stop = min((stopping.get(d, f.t_detect) for d in f.dead), default=f.t_detect)
        first = t_stop if self.measured is None else min(t_stop, self.measured["t_stop"])
        quiesce_s = time.time() - f.t_detect - plan_s  # the first death seen -> the failure at rest
        self.measured = {
            "t_stop": first, "detect_s": f.t_detect - t_stop, "quiesce_s": quiesce_s, "plan_s": plan_s,
            "gen": generation,
        }  # fmt: skip

    def committed(self, events: list[dict], joined: dict) -> dict | None:
        """An iteration was committed: the fail-stop event whose recovery this completes, annotated
        (`close_recovery`), or None."""
        if self.measured is None:
            return None
        stop, self.measured = close_recovery(self.measured, events, joined), None
        return stop


def close_recovery(rec: dict, events: list[dict], joined: dict) -> dict:
    """Annotate the last fail-stop event with the kill -> first committed iteration breakdown and
    return it; `joined`: generation -> its members' `Joined` messages (their seconds, the slowest
    member's)."""
    got = joined.get(rec["gen"], [])
    stop = next(e for e in reversed(events) if e["kind"] == "fail-stop")
    stop["recovery"] = {
        "kill_to_commit_s": time.time() - rec["t_stop"],
        "detect_s": rec["detect_s"],
        "quiesce_s": rec["quiesce_s"],
        "plan_s": rec["plan_s"],
        **{
            k: max((getattr(m, k) for m in got), default=0.0)
            for k in ("teardown_s", "group_s", "transfer_s", "build_s")
        },
    }
    return stop
