"""The run's events: the one place the controller makes them, hands them on as they happen, keeps them.

Every event of a run (docs/runtime.md, "Events": `inject-*`, `fault-end`, `fail-stop`, `fail-slow`,
`link-slow`, `replan`, `state-transfer`, `snapshot-restore`, `restart`, `rejoin`, `checkpoint`, and the last
event of a job that stopped early, `job-failed` or `interrupted`) is made by `EventLog.emit`, which
keeps it (`events`, in the order made) and hands it to the live callback `on_event(event, plans)`
— `resihp train` prints it (`runtime/live.py`). The one event completed later, a `fail-stop` whose
recovery is measured once the re-run iteration commits, is handed on again then (`completed`).

Torch-free.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import replace

from ..faults import FaultEnd, TimedFaults, inject_event
from ..job import Interrupted, WorkerFailed


class EventLog:
    """`events`: every event, in the order made; `plans`: every generation's plan so far (the
    controller's list: a replan's layout is read from it); `on_event`: the live callback or None."""

    def __init__(self, plans: list, on_event: Callable[[dict, list], None] | None = None) -> None:
        self.events: list[dict] = []
        self.plans, self.on_event = plans, on_event

    def emit(self, event: dict) -> None:
        self.events.append(event)
        if self.on_event is not None:
            self.on_event(event, self.plans)

    def completed(self, event: dict) -> None:
        """`event` (already emitted) gained fields: hand it on again."""
        if self.on_event is not None:
            self.on_event(event, self.plans)

    def inject(self, timed: TimedFaults, it: int) -> None:
        """The `inject-*` events of the faults that take effect at iteration `it` — iteration-keyed,
        or resolved from time by now — as it is about to run (never for an iteration a stopped job
        did not reach)."""
        given = {replace(g, at_s=None, at_iter=a): (g, e) for g, a, e in timed.injected}
        for f in timed.faults:
            if not isinstance(f, FaultEnd) and f.at_iter == it:
                self.emit(inject_event(f, it, *given.get(f, (None, None))))

    def stop(self, stop: WorkerFailed | Interrupted, it: int, generation: int) -> None:
        """The last event of a job that stopped early while iteration `it` of `generation` was next
        to commit: `interrupted` (with the signal's name) or `job-failed` (the devices blamed, the
        error's whole text, what the user can do: `stop.advice`)."""
        if isinstance(stop, Interrupted):
            self.emit({"iter": it, "kind": "interrupted", "signal": signal.Signals(stop.signum).name})
        else:
            self.emit({
                "iter": it, "kind": "job-failed", "devices": list(stop.devices), "generation": generation,
                "error": str(stop), "advice": stop.advice,
            })  # fmt: skip
