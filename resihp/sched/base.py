"""The policy contract (baselines.md §0): from (job, current plan, cluster state, failure reports)
to a new Plan, the reconfiguration it costs, and its predicted iteration time.

Policies are pure and deterministic: no torch, no clocks, no global state. The job simulator and
the runtime's controller both call them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from resihp.core.cluster import Cluster
from resihp.core.plan import Plan
from resihp.core.report import FailureReport
from resihp.core.scenario import Job


@dataclass(frozen=True)
class Reconfig:
    """What changing plans costs. `transfers` = (src device, dst device, bytes); src -1 = snapshot."""

    rebuilt_groups: tuple[tuple[int, ...], ...] = ()
    transfers: tuple[tuple[int, int, int], ...] = ()
    layers_moved: int = 0
    pause_s: float = 0.0  # planning + group rebuild + state transfer (+ restart) before training resumes
    lost_work_s: float = 0.0  # training time thrown away (checkpoint-restart)


@dataclass(frozen=True)
class Decision:
    plan: Plan | None  # None: the policy aborts the job
    reconfig: Reconfig = field(default_factory=Reconfig)
    predicted_iteration_s: float = float("inf")
    reason: str = ""

    @property
    def aborted(self) -> bool:
        return self.plan is None


class Policy(ABC):
    """A resilience policy. Subclasses set `name` and implement `adapt`."""

    name: str = "?"

    def initial_plan(self, job: Job, cluster: Cluster) -> Plan:
        return job.initial_plan()

    @abstractmethod
    def adapt(self, job: Job, plan: Plan, cluster: Cluster, reports: list[FailureReport]) -> Decision:
        """React to `reports` (already applied to `cluster`) with a new plan, or abort."""
