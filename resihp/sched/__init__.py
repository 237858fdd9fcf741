"""Scheduler policies (torch-free): from a failure report to a new Plan and its reconfiguration.

`POLICIES` (registry.py) maps every policy name to its class; every class takes keyword options
only and has sane defaults, so `POLICIES[name]()` is a working policy, and `build_policy(name,
options)` checks the options first. A policy plans for a `PlanningContext` (context.py). Building
blocks for other policies: `select_tp_subgroup` / `uneven_stage` (tp.py), `repartition_paper` /
`minmax_partition` (partition.py), `progress_migrate` (progress.py), `balance_migrate`
(migrate.py) and `reconfig_cost` with the shared cost constants (reconfig.py).
"""

from .base import Decision, Policy, Reconfig
from .context import PlanningContext
from .detector import DetectorSpec
from .migrate import balance_migrate, microbatch_costs
from .ours import ResiHP
from .paper import ResiHPPaper
from .partition import minmax_partition, repartition_paper
from .progress import progress_migrate
from .reconfig import (
    COMM_REBUILD_S,
    LAYER_FIXED_S,
    NODE_COPY,
    OTHER_NODE,
    SNAPSHOT,
    reconfig_cost,
    transfer_s,
)
from .registry import POLICIES, build_policy
from .tp import select_tp_subgroup, uneven_stage

__all__ = [
    "COMM_REBUILD_S",
    "LAYER_FIXED_S",
    "NODE_COPY",
    "OTHER_NODE",
    "POLICIES",
    "SNAPSHOT",
    "Decision",
    "DetectorSpec",
    "PlanningContext",
    "Policy",
    "Reconfig",
    "ResiHP",
    "ResiHPPaper",
    "balance_migrate",
    "build_policy",
    "microbatch_costs",
    "minmax_partition",
    "progress_migrate",
    "reconfig_cost",
    "repartition_paper",
    "select_tp_subgroup",
    "transfer_s",
    "uneven_stage",
]
