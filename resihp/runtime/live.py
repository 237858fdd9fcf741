"""What `resihp train` shows while it runs: progress, and every event of the run as it happens.

`Progress` writes to stderr (stdout stays free for the summary): a rich bar when stderr is a TTY
and rich is installed, one plain line per committed iteration otherwise; each event the controller
makes reaches `Progress.event` at once (`launch_elastic(on_event=...)`) and is printed as one line
above the bar (plain: in order, between the iteration lines). `enabled=False` (`--quiet`) silences
both. The words are `core.run_events`', the same as `resihp report`'s.
"""

from __future__ import annotations

import sys

from resihp.core.plan import Plan
from resihp.core.run_events import describe, died, recovery_time

QUIET_KINDS = ("state-transfer",)  # not printed live: its times are in the recovery's line
STYLES = {
    "fail-stop": "bold red", "job-failed": "bold red", "interrupted": "bold red", "recovered": "green",
    "rejoin": "green", "fail-slow": "yellow", "link-slow": "yellow", "replan": "cyan",
}  # fmt: skip


def event_line(event: dict, plans: list[Plan]) -> tuple[str, str] | None:
    """(kind, the words) of one event as it happens, None for one not shown live. A `fail-stop`
    comes twice: when the device dies, and as `recovered` once its recovery is measured."""
    kind = event["kind"]
    if kind in QUIET_KINDS:
        return None
    if kind == "fail-stop":
        rec = event.get("recovery")
        return (
            ("recovered", f"device {event['devices']} in {recovery_time(rec)}")
            if rec
            else (kind, died(event))
        )
    by_generation = {p.generation: p.to_dict() for p in plans[-2:]} if kind == "replan" else None
    return kind, describe(event, by_generation)


class Progress:
    """Live progress of `total` iterations on `stream` (default stderr)."""

    def __init__(self, total: int, enabled: bool = True, stream=None) -> None:
        self.total, self.enabled = total, enabled
        self.stream = stream or sys.stderr
        self._rich = None
        if enabled and self.stream.isatty():
            try:
                from rich.console import Console
                from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

                self._rich = Progress(
                    TextColumn("[bold]train"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TextColumn("{task.description}"),
                    console=Console(file=self.stream),
                    transient=False,
                )
                self._task = self._rich.add_task("starting workers", total=total)
                self._rich.start()
            except ImportError:
                self._rich = None

    def update(self, row: dict, samples_per_s: float) -> None:
        if not self.enabled:
            return
        text = (
            f"iter {row['iter'] + 1}/{self.total}  loss {row['loss']:.4f}  "
            f"samples/s {samples_per_s:.1f}  gen {row['generation']}"
        )
        if self._rich is not None:
            self._rich.update(self._task, advance=1, description=text)
        else:
            print(text, file=self.stream, flush=True)

    def event(self, event: dict, plans: list[Plan]) -> None:
        """One line for `event` (the controller's `on_event`)."""
        line = event_line(event, plans) if self.enabled else None
        if line is None:
            return
        kind, words = line
        if self._rich is not None:
            from rich.text import Text

            text = Text()
            text.append(f"{kind:<13}", style=STYLES.get(kind, "bold"))
            text.append(f" iter {event['iter']}: ", style="dim")
            text.append(words)
            self._rich.console.print(text)
        else:
            print(f"{kind:<13} iter {event['iter']}: {words}", file=self.stream, flush=True)

    def close(self) -> None:
        if self._rich is not None:
            self._rich.stop()
