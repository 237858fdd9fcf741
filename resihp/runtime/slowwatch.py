"""Live fail-slow detection in the controller: measured compute-only timings -> `Localizer`.

The prediction of each compute instruction (F/B/W of one micro-batch) is the device's own time
for it in a baseline iteration of the same Plan generation — the MTP calibrated from the runtime's
own measurements, per device and instruction. The first iteration of the job is a warm-up (lazy
initialisation) and never a baseline. `Localizer` (relative mode: factors divided by their median
over devices) then blames only stragglers; a fault present before the baseline iteration is, by
construction, invisible (known gap). `threshold` is wider than the detector's default because two
shared CPU cores make compute timings noisy.
"""

from __future__ import annotations

from resihp.core.report import FailureReport
from resihp.detect import LocalizeConfig, Localizer

COMPUTE_OPS = ("F", "B", "W")


class SlowWatch:
    """Feed it every device's trace records of each committed iteration; it returns fail-slow reports."""

    def __init__(self, first_iteration: int, threshold: float = 0.4) -> None:
        self.localizer = Localizer(LocalizeConfig(window_iters=2, threshold=threshold, min_samples=3))
        self.first = first_iteration
        self.generation = -1
        self.baseline: dict[int, dict[tuple, float]] = {}

    def observe(self, it: int, generation: int, records: list[dict]) -> list[FailureReport]:
        """`records`: one trace record per plan device of committed iteration `it`."""
        if generation != self.generation:  # new plan: new work per device, new baseline
            self.generation, self.baseline = generation, {}
            self.localizer.forget()
        times = {
            r["device"]: {(op, src, mb): t for op, src, mb, t, _ in r["instrs"] if op in COMPUTE_OPS}
            for r in records
        }
        if not self.baseline:
            if it > self.first:
                self.baseline = times
            return []
        compute = {}
        for dev, own in times.items():
            base = self.baseline.get(dev, {})
            keys = [k for k in own if base.get(k, 0.0) > 0.0]
            compute[dev] = ([own[k] for k in keys], [base[k] for k in keys])
        self.localizer.observe(it, compute)
        return [r for r in self.localizer.localize(it) if r.kind == "fail-slow"]
