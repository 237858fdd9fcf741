"""Live fail-slow detection in the controller: committed iterations -> `detect.online` -> new reports.

Compute: each committed iteration's compute rows (F/B/W with their micro-batch's N and Σl² from the
job's workload, `Workload.pack`) and its observed time (the slowest device's `wall_s`) go to
`resihp.detect.online.OnlineDetector`: the MTP fitted online per work class and kind, the ITP on the
Program's DAG with change points on observed ÷ predicted, and localization against each device's
own prediction and against the devices doing the same work (docs/detector.md, "Live"). It reports
`fail-slow` (severity: the speed p̂ against healthy peers, an absolute estimate) and `recovered`
(a reported device back at speed); a device slow from iteration 0 is found too (when its work
class has peers).

Links, with `links` (the runtime's link model is on, `run.link_mb_per_s` > 0): the prediction of
each P2P transfer (the trace's `links` entries: one received block, keyed by sender, receiver,
kind and micro-batch) is its time in a baseline iteration (the second of the generation: the first
is lazy initialisation); `Localizer` (relative mode) blames the stragglers.

With `calibrate` (a callable `(generation, records) -> Hardware`; `watch_job` closes over
`calibrate.calibrate_hardware`), the first baseline iteration also calibrates the hardware the
scheduler policy plans on (`hardware`; None until then).

`speeds` (device -> p̂ of every device reported slow and not back) is the detector's knowledge and
what the policy plans with; `admit` keeps the reports the controller acts on (each link once per
generation, its estimate compounded: a link's factor is relative to its generation's baseline) and
`before`: the estimates as they were before the last admitted reports (the policy's `before` view).
"""

from __future__ import annotations

from collections.abc import Callable

from resihp.core.report import FailureReport
from resihp.core.trace_format import LinkRow
from resihp.detect import LocalizeConfig, Localizer
from resihp.detect.online import OnlineConfig, OnlineDetector, record_chunks

from .calibrate import calibrate_hardware


class SlowWatch:
    """Feed it every device's trace records of each committed iteration of `plans[generation]`
    (`workload`: the job's, for the micro-batches' documents; `cpu`: CPU workers, whose records'
    `cpu_s` decide who is slow, `OnlineDetector`); it returns fail-slow, recovered and (with
    `links`) link-slow reports."""

    def __init__(
        self,
        plans: list,
        workload,
        links: bool = False,
        calibrate: Callable[[int, list], object] | None = None,
        config: OnlineConfig | None = None,
        threshold: float = 0.4,
        cpu: bool = False,
    ) -> None:
        self.plans, self.workload, self.cpu = plans, workload, cpu
        self.speeds: dict[int, float] = {}  # device -> speed estimate p, shared with the detector
        self.detector = OnlineDetector(config, known=self.speeds)
        self.localizer = Localizer(LocalizeConfig(window_iters=2, threshold=threshold, min_samples=3))
        self.links = links
        self.calibrate = calibrate
        self.hardware = None  # calibrate(...) of the first baseline iteration
        self.generation, self.seen = -1, 0  # iterations of the generation observed so far
        self.link_baseline: dict[tuple, LinkRow] = {}  # block -> its row in the baseline iteration
        self.link_factors: dict[tuple[int, int], float] = {}  # (lo, hi) -> compound bandwidth factor f
        self.reported: set[tuple] = set()  # (generation, (lo, hi))
        self.before: tuple[dict, dict] = ({}, {})  # (speeds, link_factors) before the last reports
        self._prior: dict[int, float] = {}  # speeds before the last observe

    def observe(self, it: int, generation: int, records: list[dict]) -> list[FailureReport]:
        """`records`: one trace record per plan device of committed iteration `it`; the new reports."""
        plan = self.plans[generation]
        if generation != self.generation:  # new plan: new work per device, new baseline
            self.generation, self.seen, self.link_baseline = generation, 0, {}
            self.localizer.forget()
        self.seen += 1
        batch = self.workload.pack(it, plan.global_microbatches)
        chunks = {r["device"]: record_chunks(plan, batch, r, self.cpu) for r in records}
        observed = max(r.get("wall_s", 0.0) for r in records)
        self._prior = dict(self.speeds)
        found = self.detector.observe(it, plan, chunks, observed, batch.seq_len, batch.sum_sq)
        transfers = {row.block: row for r in records for row in r.get("links", ())} if self.links else {}
        if self.seen <= 2:  # the warm-up, then the baseline
            if self.seen == 2:
                self.link_baseline = transfers
                if self.calibrate is not None and self.hardware is None:
                    self.hardware = self.calibrate(generation, records)
            return found
        links: dict[tuple[int, int], tuple[list, list]] = {}
        for block, row in transfers.items():
            base = self.link_baseline.get(block)
            if base is not None and base.transfer_s > 0.0 and row.transfer_s > 0.0:
                meas, pred = links.setdefault(row.link, ([], []))
                meas.append(row.transfer_s)
                pred.append(base.transfer_s)
        if links:
            self.localizer.observe(it, {}, links)
            found += self.localizer.localize(it)
        return found

    def admit(self, generation: int, reports: list[FailureReport]) -> list[FailureReport]:
        """The reports to act on: fail-slow and recovered as the detector made them (it reports each
        episode once), each link once per `generation` (folded into its compound estimate)."""
        new = []
        links_before = dict(self.link_factors)
        for rep in reports:
            if rep.kind in ("fail-slow", "recovered") and rep.devices:
                new.append(rep)
            elif rep.kind == "link-slow" and (generation, rep.link) not in self.reported:
                self.reported.add((generation, rep.link))
                self.link_factors[rep.link] = self.link_factors.get(rep.link, 1.0) * rep.severity
                new.append(rep)
        if new:
            self.before = (self._prior, links_before)
        return new


def watch_job(plans: list, job) -> SlowWatch:
    """The controller's watch of `job` (a `JobSpec`), `plans` its generations' plans (growing): P2P
    timings count when the link model is on; the first baseline iteration also calibrates the
    hardware the scheduler policy plans on (`calibrate.calibrate_hardware`)."""

    def fit(generation: int, records: list):
        return calibrate_hardware(plans[generation], job.workload, records, job.link_mb_per_s)

    return SlowWatch(plans, job.workload, links=job.link_mb_per_s > 0, calibrate=fit, cpu=job.device == "cpu")


def slow_event(rep: FailureReport, reason: str) -> dict:
    """The controller's event for an admitted report: {"iter", "kind", "devices" | "link",
    "severity", "reason"} (`reason`: the replan it led to, or why none)."""
    where = {"link": list(rep.link)} if rep.kind == "link-slow" else {"devices": list(rep.devices)}
    return {"iter": rep.iteration, "kind": rep.kind, **where, "severity": rep.severity, "reason": reason}
