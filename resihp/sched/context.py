"""What a policy plans for, beside the live cluster and the plan that runs now (torch-free).

Both callers build it from the objects they have, nothing guessed: the job simulator from its
scenario (`PlanningContext.of_job`: the uniform plan, the scenario's cluster and workload), the
runtime's controller from its generation-0 plan, its node layout (`run.devices_per_node`) and the
hardware it calibrated (`resihp.runtime.adapt.reconfig.planning_context`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from resihp.core.cluster import Cluster
from resihp.core.model_spec import ModelSpec
from resihp.core.plan import Plan
from resihp.core.workload import Workload


@dataclass(frozen=True)
class PlanningContext:
    """`home`: the job's initial plan. Planning starts from its positions (replica, stage) -> TP
    group, so re-joined devices go back to their places and a whole healthy cluster gives `home`
    back; its degrees and schedule are the job's. `workload`: tokens and micro-batches per replica.
    `cluster`: the job's devices as built (nodes x devices per node of one hardware, healthy); the
    live state (deaths, speeds, slow links) is the `cluster` argument of `Policy.adapt`.

    The degrees below are exact for a uniform home; for an irregular one they are its widest TP
    group and its longest replica (the bounds a re-formed group or pipeline keeps to).
    """

    home: Plan
    workload: Workload
    cluster: Cluster

    def __post_init__(self) -> None:
        for dev in (*self.home.devices(), *self.home.standby):
            self.cluster.check_device(dev, "home plan device")

    @classmethod
    def of_job(cls, job) -> PlanningContext:
        """A scenario `Job`'s context: its uniform initial plan, workload and cluster."""
        return cls(job.initial_plan(), job.workload, job.cluster)

    @property
    def model(self) -> ModelSpec:
        return self.home.model

    @property
    def schedule(self) -> str:
        return self.home.schedule

    @cached_property
    def tp(self) -> int:
        return max(st.tp for stages in self.home.replicas for st in stages)

    @cached_property
    def pp(self) -> int:
        return max(len(stages) for stages in self.home.replicas)

    @property
    def dp(self) -> int:
        return self.home.dp

    @property
    def global_microbatches(self) -> int:
        return self.home.global_microbatches
