"""Torch-free data model: Cluster, ModelSpec, Workload, Plan, FaultSpec, Program."""

from .cluster import Cluster
from .faults import FAULT_KINDS, FaultSpec
from .model_spec import PRESETS, ModelSpec, model_preset
from .plan import SCHEDULES, Plan, Stage, build_stage, even_split, split_by_weight
from .report import REPORT_KINDS, FailureReport
from .workload import LENGTH_KINDS, PackedBatch, Workload

__all__ = [
    "FAULT_KINDS",
    "LENGTH_KINDS",
    "REPORT_KINDS",
    "FailureReport",
    "PRESETS",
    "SCHEDULES",
    "Cluster",
    "FaultSpec",
    "ModelSpec",
    "PackedBatch",
    "Plan",
    "Stage",
    "Workload",
    "build_stage",
    "even_split",
    "model_preset",
    "split_by_weight",
]
