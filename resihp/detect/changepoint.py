"""Fail-slow detection on the iteration-time series: Greyhound's stage (a) and ResiHP's filter (b).

Stage (a), shared by both detectors (`ChangePointStage`):
  1. BOCPD on log iteration time; a *candidate* when P(r_t < window) > threshold (see `bocpd`),
     dated at the most likely recent run start c.
  2. Once `persistence` points from c on exist (c included), compare the mean of those points with
     the mean of the `before_window` points before c, each after dropping robust-z > `outlier_z`
     outliers (median/MAD z, so one spike cannot hide another). |shift| >= `min_shift` confirms a
     (with `persist_all`, only if every one of those points is itself shifted by >= min_shift the
     same way: two spikes among three points are not a level change)
     `Detection`; otherwise the candidate was jitter. One candidate is pending at a time; a
     candidate dated at or before the last handled one is ignored.

Stage (b), ResiHP's workload filter (`ResiHPDetector`, mode "filter"): a confirmed slowdown goes to
localization only if the median of observed/predicted over its confirmation window exceeds
1 + `gate` (with persistence 1 this is the paper's "observed at the change point > 1.25 × predicted
healthy"). Otherwise it is benign: its points with ratio <= 1 + gate are removed from the series, the
BOCPD is rewound to before them and the rest replayed, so they do not bias later detection.
Mode "normalize" ("FLOPs-aware normalization") runs stage (a) on observed/predicted instead and
alarms on every confirmed slowdown of the ratio; nothing is removed.

`GreyhoundDetector` alarms on every confirmed slowdown (each alarm costs a validation pause).
Slowdowns are alarms; confirmed speed-ups are kept in `detections` (recoveries) only.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, fields, replace

import numpy as np

from .bocpd import BOCPD


@dataclass(frozen=True)
class DetectorConfig:
    hazard: float = 1.0 / 250.0  # BOCPD constant hazard
    threshold: float = 0.9  # on P(r_t < window)
    window: int = 10
    sigma0: float = 0.05  # prior std of log iteration time inside a run (beta0 = alpha0·sigma0²)
    kappa0: float = 0.01
    alpha0: float = 1.0
    max_run: int = 300
    min_shift: float = 0.10  # Greyhound: mean before/after differs by >= 10%
    outlier_z: float = 3.0
    persistence: int = 3  # points from the change point on before deciding (artifact: 10)
    before_window: int = 30
    min_before: int = 10  # no decision before this much history
    gate: float = 0.25  # ResiHP: observed > (1 + gate) × predicted goes to localization
    max_lag: int = 64  # how many recent points can still be removed from the series
    persist_all: bool = False  # every confirmation point must be shifted, not just their mean

    def __post_init__(self) -> None:
        def bad(name: str, allowed: str) -> ValueError:
            return ValueError(f"detector.{name} = {getattr(self, name)!r}: {allowed}")

        if not 0.0 < self.hazard < 1.0:
            raise bad("hazard", "must lie in (0, 1)")
        if not 0.0 < self.threshold < 1.0:
            raise bad("threshold", "must lie in (0, 1)")
        for name in ("sigma0", "kappa0", "alpha0", "min_shift", "outlier_z"):
            if not getattr(self, name) > 0:
                raise bad(name, "must be > 0")
        if self.gate < 0:
            raise bad("gate", "must be >= 0")
        for name, lo in (
            ("window", 2),
            ("max_run", 2),
            ("persistence", 1),
            ("before_window", 2),
            ("min_before", 1),
            ("max_lag", 1),
        ):
            v = getattr(self, name)
            if not isinstance(v, int) or v < lo:
                raise bad(name, f"must be an integer >= {lo}")
        if self.min_before > self.before_window:
            raise bad("min_before", f"must be <= before_window ({self.before_window})")

    @classmethod
    def from_dict(cls, raw: dict) -> DetectorConfig:
        known = {f.name for f in fields(cls)}
        for key in raw:
            if key not in known:
                raise ValueError(f"detector.{key}: unknown key; allowed: {', '.join(sorted(known))}")
        return cls(**raw)


@dataclass(frozen=True)
class Detection:
    """A confirmed change: `change_iteration` (first point of the new level), `detected_at`."""

    change_iteration: int
    detected_at: int
    before_mean: float
    after_mean: float
    shift: float  # after / before − 1


@dataclass(frozen=True)
class Alarm:
    """A slowdown handed on to localization/validation."""

    iteration: int  # the change point
    detected_at: int
    shift: float
    ratio: float | None = None  # median observed/predicted over the confirmation window


def _robust_mean(v: np.ndarray, z: float) -> float:
    med = float(np.median(v))
    mad = 1.4826 * float(np.median(np.abs(v - med)))
    if mad == 0.0:
        mad = 1.2533 * float(np.mean(np.abs(v - med)))
    if mad == 0.0:
        return med
    return float(np.mean(v[np.abs(v - med) <= z * mad]))


class ChangePointStage:
    """Stage (a): BOCPD candidate → mean shift → persistence, with point removal for stage (b)."""

    def __init__(self, config: DetectorConfig) -> None:
        self.config = config
        c = config
        self._bocpd = BOCPD(c.hazard, None, c.kappa0, c.alpha0, c.alpha0 * c.sigma0**2, c.max_run)
        # (iteration, value, tag, BOCPD state before this point)
        self._hist: deque[tuple[int, float, object, tuple]] = deque(maxlen=c.before_window + c.max_lag)
        self._pending: int | None = None
        self._handled = -math.inf

    def reconfigure(self, config: DetectorConfig) -> None:
        """New thresholds apply from the next point; priors apply to runs started from then on."""
        self.config = config
        b = self._bocpd
        b.hazard, b.kappa0, b.alpha0 = config.hazard, config.kappa0, config.alpha0
        b.beta0, b.max_run = config.alpha0 * config.sigma0**2, config.max_run
        if self._hist.maxlen != config.before_window + config.max_lag:
            self._hist = deque(self._hist, maxlen=config.before_window + config.max_lag)

    @property
    def change_probability(self) -> float:
        return self._bocpd.change_probability(self.config.window)

    def points(self, since: int = -1) -> list[tuple[int, float, object]]:
        """Retained (iteration, value, tag) with iteration >= since, oldest first."""
        return [(it, v, tag) for it, v, tag, _ in self._hist if it >= since]

    def push(self, iteration: int, value: float, tag: object = None) -> Detection | None:
        """Add one point (> 0; BOCPD sees its log); return a Detection when one is confirmed."""
        if not value > 0:
            raise ValueError(f"iteration {iteration}: value {value!r} must be > 0")
        if self._hist and iteration <= self._hist[-1][0]:
            raise ValueError(f"iteration {iteration}: iterations must increase")
        c = self.config
        state = self._bocpd.state()
        self._bocpd.update(math.log(value))
        self._hist.append((iteration, value, tag, state))
        if self._bocpd.change_probability(c.window) > c.threshold and self._pending is None:
            k = self._bocpd.t - self._bocpd.change_index(c.window)  # points in the new run
            if k <= len(self._hist):
                start = self._hist[-k][0]
                if start > self._handled:
                    self._pending = start
        return self._decide(iteration)

    def _decide(self, iteration: int) -> Detection | None:
        c = self.config
        if self._pending is None:
            return None
        start = self._pending
        after = np.array([v for it, v, _, _ in self._hist if it >= start])
        if after.size < c.persistence:
            return None
        before = np.array([v for it, v, _, _ in self._hist if it < start][-c.before_window :])
        self._pending = None
        self._handled = start
        if before.size < c.min_before:
            return None
        b, a = _robust_mean(before, c.outlier_z), _robust_mean(after, c.outlier_z)
        shift = a / b - 1.0
        if abs(shift) < c.min_shift:
            return None
        if c.persist_all and not np.all(np.sign(shift) * (after / b - 1.0) >= c.min_shift):
            return None
        self._handled = iteration  # later candidates inside this window are the same change
        return Detection(start, iteration, b, a, shift)

    def remove(self, iterations) -> None:
        """Drop these iterations from the series: rewind the BOCPD before the first, replay the rest."""
        drop = set(iterations)
        pos = next((i for i, e in enumerate(self._hist) if e[0] in drop), None)
        if pos is None:
            return
        entries = list(self._hist)
        self._bocpd.restore(entries[pos][3])
        for _ in range(len(entries) - pos):
            self._hist.pop()
        for it, v, tag, _ in entries[pos:]:
            if it not in drop:
                state = self._bocpd.state()
                self._bocpd.update(math.log(v))
                self._hist.append((it, v, tag, state))
        if self._pending is not None and self._pending in drop:
            self._pending = None


class _Detector:
    def __init__(self, config: DetectorConfig | None = None) -> None:
        self.config = config or DetectorConfig()
        self.stage = ChangePointStage(self.config)
        self.alarms: list[Alarm] = []
        self.detections: list[Detection] = []  # every confirmed change, speed-ups included

    def reconfigure(self, **changes) -> None:
        """Change thresholds at run time, e.g. `reconfigure(gate=0.2, persistence=2)`."""
        self.config = replace(self.config, **changes)
        self.stage.reconfigure(self.config)

    def _alarm(self, det: Detection, ratio: float | None) -> Alarm:
        alarm = Alarm(det.change_iteration, det.detected_at, det.shift, ratio)
        self.alarms.append(alarm)
        return alarm


class GreyhoundDetector(_Detector):
    """Stage (a) only: every confirmed slowdown is an alarm (→ a validation pause)."""

    def observe(self, iteration: int, observed_s: float, predicted_s: float | None = None) -> Alarm | None:
        det = self.stage.push(iteration, observed_s)
        if det is None:
            return None
        self.detections.append(det)
        return self._alarm(det, None) if det.shift > 0 else None


class ResiHPDetector(_Detector):
    """Stage (a) + the workload filter (mode "filter"), or stage (a) on observed/predicted
    (mode "normalize"). `predicted_s` is the healthy iteration time the pipeline simulator gives
    for this iteration's actual micro-batches."""

    MODES = ("filter", "normalize")

    def __init__(self, config: DetectorConfig | None = None, mode: str = "filter") -> None:
        if mode not in self.MODES:
            raise ValueError(f"detector.mode = {mode!r}: allowed: {', '.join(self.MODES)}")
        super().__init__(config)
        self.mode = mode
        self.benign: list[int] = []  # iterations removed from the series as workload-explained

    def observe(self, iteration: int, observed_s: float, predicted_s: float) -> Alarm | None:
        if not predicted_s > 0:
            raise ValueError(f"iteration {iteration}: predicted_s = {predicted_s!r} must be > 0")
        ratio = observed_s / predicted_s
        if self.mode == "normalize":
            det = self.stage.push(iteration, ratio, ratio)
        else:
            det = self.stage.push(iteration, observed_s, ratio)
        if det is None:
            return None
        self.detections.append(det)
        if det.shift <= 0:
            return None
        window = self.stage.points(det.change_iteration)
        med = float(np.median([tag for _, _, tag in window]))
        if self.mode == "normalize" or med > 1.0 + self.config.gate:
            return self._alarm(det, med)
        benign = [it for it, _, tag in window if tag <= 1.0 + self.config.gate]
        self.stage.remove(benign)
        self.benign.extend(benign)
        return None
