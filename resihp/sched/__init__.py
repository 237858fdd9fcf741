"""Scheduler policies (torch-free): from a failure report to a new Plan and its reconfiguration.

`POLICIES` maps a policy name to its class; every class takes keyword options only and has sane
defaults, so `POLICIES[name]()` is a working policy. Building blocks for other policies:
`select_tp_subgroup` / `uneven_stage` (tp.py), `repartition_paper` / `minmax_partition`
(partition.py), `progress_migrate` (progress.py), `balance_migrate` (migrate.py) and
`reconfig_cost` with the shared cost constants (reconfig.py).
"""

from .base import Decision, Policy, Reconfig
from .migrate import balance_migrate, microbatch_costs
from .ours import ResiHP
from .paper import ResiHPPaper
from .partition import minmax_partition, repartition_paper
from .progress import progress_migrate
from .reconfig import COMM_REBUILD_S, LAYER_FIXED_S, SNAPSHOT, STATE_BYTES_PER_PARAM, reconfig_cost
from .tp import select_tp_subgroup, uneven_stage

POLICIES: dict[str, type[Policy]] = {
    "resihp-paper": ResiHPPaper,
    "resihp": ResiHP,
}

__all__ = [
    "COMM_REBUILD_S",
    "LAYER_FIXED_S",
    "POLICIES",
    "SNAPSHOT",
    "STATE_BYTES_PER_PARAM",
    "Decision",
    "Policy",
    "Reconfig",
    "ResiHP",
    "ResiHPPaper",
    "balance_migrate",
    "microbatch_costs",
    "minmax_partition",
    "progress_migrate",
    "reconfig_cost",
    "repartition_paper",
    "select_tp_subgroup",
    "uneven_stage",
]

from .baselines import BASELINES  # noqa: E402  (the competing systems, baselines.md)

POLICIES.update(BASELINES)
