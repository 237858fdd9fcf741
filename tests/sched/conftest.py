"""Small jobs shared by the scheduler tests, as the planning context a policy gets."""

from __future__ import annotations

import pytest

from resihp.core import Cluster, Workload, model_preset
from resihp.core.scenario import Job
from resihp.sched import PlanningContext


def make_ctx(preset="llama2-7b", tp=4, pp=2, dp=2, mbs=4, nodes=2, gpn=8, seq_len=4096) -> PlanningContext:
    job = Job(model_preset(preset), Cluster(nodes, gpn), Workload(seq_len, mbs), tp, pp, dp)
    return PlanningContext.of_job(job)


@pytest.fixture
def ctx() -> PlanningContext:
    return make_ctx()
