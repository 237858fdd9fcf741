"""The loss account: where the capacity bound's samples go, by cause, over a job's timeline.

The job simulator integrates, over the same intervals, the bound's instantaneous rate
c(t) = X0 · Σ live speed / N and the achieved rate x(t) (0 while paused, hung or aborted); the
run's two averages are those integrals over the horizon. The account integrates the gap c(t) - x(t)
over those intervals too and hands every piece of it to exactly one cause, so

    samples_per_s / capacity_bound_samples_per_s + Σ lost = 1

holds by construction (to float rounding and the JSON's 6 decimals), not by a remainder. At each
instant, the first rule that applies decides:

1. aborted: the whole bound goes to `plan_quality` (the policy holds no plan that runs);
2. paused: the whole bound goes to the cause of the pause piece being served. A Decision's pause is
   served as: validation of a confirmed fail-slow (`detection`), planning (`planning`: the policy's
   `planning_s`, charged inside `reconfig.pause_s` whenever the plan changes, reconfig.py), group
   rebuild, state transfer or restart (`pause`: the rest of `reconfig.pause_s`), then the lost work
   redone (`rework`: `reconfig.lost_work_s`). A false alarm's pause is `detection` too (the
   detector's cost, with its latency and validation). Pauses queue one after another, as job.py's
   `pause_until` does;
3. running, the policy's view equal to the true cluster: the gap goes to `plan_quality` (the
   steady state of the chosen plan below the bound; a plan kept on a dead device waiting for
   repair runs at 0 and counts here too);
4. running, some change of the true cluster not (yet) reported to the policy (a fault inside its
   detection latency, a fault its detector never sees, an unreported re-join): the plan's
   efficiency e = x(plan, view) / c(view) on the cluster the policy knows is its steady state, so
   `plan_quality` gets c·(1 - e) clamped into [0, gap] and `detection` the rest.

Every instant has one of the five named causes, so `other` holds nothing today (0 in every run):
it is the place for a cost the simulator may add that none of the five describes. Every term but
`plan_quality` is >= 0 by construction. `plan_quality` is the net steady-state gap:
where the achieved rate exceeds the bound's instantaneous rate (the bound X0 · Σ live speed / N is
no bound at every instant: a healthy plan leaves slack that a slow device can be placed in, a
smaller TP group can be more efficient per device than X0's, and fewer replicas with more
micro-batches each have smaller pipeline bubbles), the excess is a negative gap and
stays in `plan_quality`, so the identity holds; `above_bound` in the JSON is that excess as a
share of the bound's samples (not part of the sum), so plan_quality + above_bound >= 0 always.

Per event: a pause piece is charged to the event that caused it (replan, escalate, false-alarm),
detection to the latest fault event of each unreported change (evenly when several), plan quality
to the decision that installed the running plan (or the abort). The initial plan's plan quality,
before any decision, is `lost_initial_plan`; events' entries plus it sum to `lost`.
"""

from __future__ import annotations

from collections import deque

CAUSES = ("detection", "planning", "pause", "rework", "plan_quality", "other")


def unknown_changes(true, view) -> list:
    """Keys (device id or link pair) on which the true cluster differs from the policy's view."""
    keys: list = [
        d
        for d in range(true.num_devices)
        if true.alive[d] != view.alive[d] or (true.alive[d] and true.speed[d] != view.speed[d])
    ]
    links_true = {(a, b): f for a, b, f in true.links}
    links_view = {(a, b): f for a, b, f in view.links}
    keys += sorted(k for k in links_true.keys() | links_view.keys() if links_true.get(k) != links_view.get(k))
    return keys


class LossAccount:
    """Lost samples by cause and by event while a job runs; `close` turns them into fractions.

    `planning_s`: the share of every pausing Decision's `reconfig.pause_s` that is planning (the
    policy's own `planning_s`; policies without one plan for free or inside their restart).
    """

    def __init__(self, planning_s: float = 0.0) -> None:
        self.planning_s = planning_s
        self.total = dict.fromkeys(CAUSES, 0.0)  # lost samples
        self.initial = 0.0  # plan quality of the initial plan (no event)
        self.above = 0.0  # samples by which the achieved rate exceeded the bound's
        self.by_event: dict[int, tuple[dict, dict]] = {}  # id(entry) -> (entry, {cause: samples})
        self.pieces: deque = deque()  # (end_s, cause, entry) of queued pause pieces, in time order
        self.latest: dict = {}  # device or link -> entry of the latest change of the true cluster
        self.plan_entry: dict | None = None  # the decision whose plan runs

    def _add(self, cause: str, entry: dict | None, samples: float) -> None:
        self.total[cause] += samples
        if entry is None:
            assert cause == "plan_quality", cause
            self.initial += samples
            return
        costs = self.by_event.setdefault(id(entry), (entry, {}))[1]
        costs[cause] = costs.get(cause, 0.0) + samples

    def fault(self, entry: dict, ev) -> None:
        """A change of the true cluster (a trace event), recorded as `entry` in the run's events."""
        self.latest[ev.link if ev.link is not None else ev.device] = entry

    def decision(self, entry: dict, plan_changed: bool) -> None:
        """A replan, escalation or abort: from now on the running plan's quality is its cost."""
        if plan_changed or entry.get("kind") == "abort":
            self.plan_entry = entry

    def decision_pause(self, entry: dict, start_s: float, end_s: float, reconfig, validation_s: float):
        """The pause [start_s, end_s) of a Decision, served as validation, planning, rebuild and
        transfer, lost work (module docstring)."""
        planning = min(self.planning_s, reconfig.pause_s) if reconfig.pause_s > 0 else 0.0
        parts = [
            ("detection", validation_s), ("planning", planning), ("pause", reconfig.pause_s - planning),
            ("rework", reconfig.lost_work_s),
        ]  # fmt: skip
        self.pause(entry, start_s, end_s, parts)

    def pause(self, entry: dict, start_s: float, end_s: float, parts) -> None:
        """Queue the pieces `parts` = [(cause, seconds)] of the pause [start_s, end_s) (end_s is the
        job's own `pause_until`, so the last piece ends exactly where the job resumes)."""
        parts = [(c, s) for c, s in parts if s > 0]
        at = start_s
        for k, (cause, seconds) in enumerate(parts):
            at = end_s if k == len(parts) - 1 else at + seconds
            self.pieces.append((at, cause, entry))

    def advance(self, run, t: float, cut: float, t_end: float, cap_rate: float, x: float) -> None:
        """Account for [t, t_end) of `run` (job._Run): paused until `cut`, then running at `x`."""
        if run.aborted:
            self._add("plan_quality", self.plan_entry, cap_rate * (t_end - t))
            return
        at = t
        while at < cut:
            end, cause, entry = self.pieces[0]
            if end <= at:
                self.pieces.popleft()
                continue
            stop = min(end, cut)
            self._add(cause, entry, cap_rate * (stop - at))
            at = stop
        dt = t_end - cut
        if dt <= 0:
            return
        gap = (cap_rate - x) * dt
        if gap < 0:
            self.above -= gap
        keys = unknown_changes(run.true, run.view)
        if not keys or gap <= 0:
            self._add("plan_quality", self.plan_entry, gap)
            return
        ref = run.timer.samples_per_s(run.plan, run.view, run.options())
        cap_view = run.x0 * run.view.capacity() / run.view.num_devices
        e = ref / cap_view if cap_view > 0 else 0.0
        quality = min(max(cap_rate * (1.0 - e) * dt, 0.0), gap)
        self._add("plan_quality", self.plan_entry, quality)
        entries = list({id(self.latest[k]): self.latest[k] for k in keys}.values())
        for entry in entries:
            self._add("detection", entry, (gap - quality) / len(entries))

    def close(self, cap_samples: float) -> dict:
        """Fractions of the bound's samples: writes each event entry's `lost` and returns
        {"lost": {cause: fraction}, "lost_initial_plan": fraction, "above_bound": fraction}."""
        scale = 1.0 / cap_samples if cap_samples > 0 else 0.0
        for entry, costs in self.by_event.values():
            shares = {c: round(costs[c] * scale, 6) for c in CAUSES if c in costs}
            entry["lost"] = {c: v for c, v in shares.items() if v != 0.0}
        return {
            "lost": {c: self.total[c] * scale for c in CAUSES},
            "lost_initial_plan": self.initial * scale,
            "above_bound": self.above * scale,
        }
