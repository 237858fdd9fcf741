"""Detector: change-point detection with the workload filter, localization (fail-slow).

Fail-stop liveness — heartbeats, hung and dead members — is the runtime's, in one place:
`resihp.runtime.control.liveness` (torch-free); the simulator models its latency (`sim.detection`).

Torch-free. The micro-batch time predictor lives in `resihp.cost.calibration`; the iteration-time
predictor (`ITP`) is the pipeline simulator (`resihp.evaluator.pipeline`) on fitted MTP rows. `replay`
runs the detectors over a run's samples, `trace_io` reads the runtime's trace, `bench` is the
accuracy protocol on synthetic jobs (`jobs`), `from_scenario` synthesizes a scenario's trace.
"""

from .bocpd import BOCPD
from .changepoint import (
    Alarm,
    ChangePointStage,
    Detection,
    DetectorConfig,
    GreyhoundDetector,
    ResiHPDetector,
)
from .itp import ITP, BatchDag
from .localize import LocalizeConfig, Localizer
from .report import REPORT_KINDS, FailureReport
from .trace_io import TraceRecord, read_trace

__all__ = [
    "BOCPD",
    "REPORT_KINDS",
    "Alarm",
    "BatchDag",
    "ChangePointStage",
    "Detection",
    "DetectorConfig",
    "FailureReport",
    "GreyhoundDetector",
    "ITP",
    "LocalizeConfig",
    "Localizer",
    "ResiHPDetector",
    "TraceRecord",
    "read_trace",
]
