"""Analytical cost model (torch-free): FLOPs, memory, communication, hardware presets.

`build_costs` turns (model, plan, cluster, batch) into the `resihp.core.costs.Costs` the pipeline
simulator evaluates; `calibration` fits the same linear form from measured chunk times.
"""

from .build import build_costs, capacity_bound, resolve_hardware
from .flops import reference_flops_per_token, training_flops_per_token
from .hardware import HARDWARE, Hardware, hardware_preset
from .memory import OPTIMIZERS, StageMemory, fits, k_min, stage_memory

__all__ = [
    "HARDWARE",
    "OPTIMIZERS",
    "Hardware",
    "StageMemory",
    "build_costs",
    "capacity_bound",
    "fits",
    "hardware_preset",
    "k_min",
    "reference_flops_per_token",
    "resolve_hardware",
    "stage_memory",
    "training_flops_per_token",
]
