"""Live fail-slow detection in the controller: measured timings -> `Localizer` -> new reports.

The prediction of each compute instruction (F/B/W of one micro-batch) is the device's own time
for it in a baseline iteration of the same Plan generation — the MTP calibrated from the runtime's
own measurements, per device and instruction. Likewise, with `links`, the prediction of each P2P
transfer (the trace's `links` entries: one received block, keyed by its sender, receiver, kind
and micro-batch) is its time in the baseline iteration. The first iteration of each generation is
a warm-up (lazy initialisation, fresh allocations) and never the baseline: a warm-up baseline on
some devices makes the others look slow relative to them. `Localizer` (relative mode: factors divided
by their median over devices, or over links when there are at least 3) then blames only
stragglers; a fault present before the baseline iteration is, by construction, invisible (known
gap). `threshold` is wider than the detector's default because two shared CPU cores make timings
noisy.

With `calibrate` (a callable `(generation, records) -> Hardware`; `watch_job`, the controller's
watch, closes over `calibrate.calibrate_hardware`), the first baseline iteration the watch takes
also calibrates the hardware the scheduler policy plans on (`hardware`; None until then): the same
healthy reference that predicts each instruction's time.

`admit` keeps what the controller acts on: each device (link) once per generation, and a compound
estimate per device (link) — each report's severity is relative to its generation's baseline, so a
device reported again after a replan is slower still than the estimate it was planned with.
"""

from __future__ import annotations

from collections.abc import Callable

from resihp.core.report import FailureReport
from resihp.core.trace_format import COMPUTE_OPS, LinkRow
from resihp.detect import LocalizeConfig, Localizer

from .calibrate import calibrate_hardware


class SlowWatch:
    """Feed it every device's trace records of each committed iteration; it returns fail-slow and
    (with `links`: the runtime's link model is on, `run.link_mb_per_s` > 0) link-slow reports."""

    def __init__(
        self,
        threshold: float = 0.4,
        links: bool = False,
        calibrate: Callable[[int, list], object] | None = None,
    ) -> None:
        self.localizer = Localizer(LocalizeConfig(window_iters=2, threshold=threshold, min_samples=3))
        self.links = links
        self.calibrate = calibrate
        self.hardware = None  # calibrate(...) of the first baseline iteration
        self.generation, self.seen = -1, 0  # iterations of the generation observed so far
        self.baseline: dict[int, dict[tuple, float]] = {}
        self.link_baseline: dict[tuple, LinkRow] = {}  # block -> its row in the baseline iteration
        self.speeds: dict[int, float] = {}  # device -> compound speed estimate p
        self.link_factors: dict[tuple[int, int], float] = {}  # (lo, hi) -> compound bandwidth factor f
        self.reported: set[tuple] = set()  # (generation, device) or (generation, (lo, hi))

    def observe(self, it: int, generation: int, records: list[dict]) -> list[FailureReport]:
        """`records`: one trace record per plan device of committed iteration `it`; every current
        suspect, worst first."""
        if generation != self.generation:  # new plan: new work per device, new baseline
            self.generation, self.seen, self.baseline, self.link_baseline = generation, 0, {}, {}
            self.localizer.forget()
        self.seen += 1
        times = {
            r["device"]: {
                (row.op, row.src, row.mb): row.compute_s for row in r["instrs"] if row.op in COMPUTE_OPS
            }
            for r in records
        }
        transfers = {row.block: row for r in records for row in r.get("links", ())} if self.links else {}
        if self.seen <= 2:  # the warm-up, then the baseline
            if self.seen == 2:
                self.baseline, self.link_baseline = times, transfers
                if self.calibrate is not None and self.hardware is None:
                    self.hardware = self.calibrate(generation, records)
            return []
        compute = {}
        for dev, own in times.items():
            base = self.baseline.get(dev, {})
            keys = [k for k in own if base.get(k, 0.0) > 0.0]
            compute[dev] = ([own[k] for k in keys], [base[k] for k in keys])
        links: dict[tuple[int, int], tuple[list, list]] = {}
        for block, row in transfers.items():
            base = self.link_baseline.get(block)
            if base is not None and base.transfer_s > 0.0 and row.transfer_s > 0.0:
                meas, pred = links.setdefault(row.link, ([], []))
                meas.append(row.transfer_s)
                pred.append(base.transfer_s)
        self.localizer.observe(it, compute, links)
        return self.localizer.localize(it)

    def admit(self, generation: int, reports: list[FailureReport]) -> list[FailureReport]:
        """The reports not yet seen in `generation`; folds each into the compound estimates."""
        new = []
        for rep in reports:
            if rep.kind not in ("fail-slow", "link-slow"):
                continue
            what = rep.link if rep.kind == "link-slow" else rep.devices[0]
            if (generation, what) in self.reported:
                continue
            self.reported.add((generation, what))
            known = self.link_factors if rep.kind == "link-slow" else self.speeds
            known[what] = known.get(what, 1.0) * rep.severity
            new.append(rep)
        return new


def watch_job(plans: list, job) -> SlowWatch:
    """The controller's watch of `job` (a `JobSpec`), `plans` its generations' plans (growing): P2P
    timings count when the link model is on; the first baseline iteration also calibrates the
    hardware the scheduler policy plans on (`calibrate.calibrate_hardware`)."""

    def fit(generation: int, records: list):
        return calibrate_hardware(plans[generation], job.workload, records, job.link_mb_per_s)

    return SlowWatch(links=job.link_mb_per_s > 0, calibrate=fit)


def slow_event(rep: FailureReport, reason: str) -> dict:
    """The controller's event for an admitted report: {"iter", "kind", "devices" | "link",
    "severity", "reason"} (`reason`: the replan it led to, or why none)."""
    where = {"link": list(rep.link)} if rep.kind == "link-slow" else {"devices": list(rep.devices)}
    return {"iter": rep.iteration, "kind": rep.kind, **where, "severity": rep.severity, "reason": reason}
