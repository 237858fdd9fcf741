"""Detector: heartbeat liveness, change-point detection with the workload filter, localization.

Torch-free. The micro-batch time predictor lives in `resihp.cost.calibration`; the iteration-time
predictor is the pipeline simulator (`resihp.sim.pipeline`), whose prediction callers pass in.
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
from .heartbeat import C10dStore, Coordinator, DictStore, HeartbeatConfig, NodeMonitor, WorkerHeartbeat
from .localize import LocalizeConfig, Localizer
from .report import REPORT_KINDS, FailureReport

__all__ = [
    "BOCPD",
    "REPORT_KINDS",
    "Alarm",
    "C10dStore",
    "ChangePointStage",
    "Coordinator",
    "Detection",
    "DetectorConfig",
    "DictStore",
    "FailureReport",
    "GreyhoundDetector",
    "HeartbeatConfig",
    "LocalizeConfig",
    "Localizer",
    "NodeMonitor",
    "ResiHPDetector",
    "WorkerHeartbeat",
]
