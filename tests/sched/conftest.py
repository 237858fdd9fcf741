"""Small jobs shared by the scheduler tests."""

from __future__ import annotations

import pytest

from resihp.core import Cluster, Workload, model_preset
from resihp.core.scenario import Job


def make_job(preset="llama2-7b", tp=4, pp=2, dp=2, mbs=4, nodes=2, gpn=8, seq_len=4096) -> Job:
    return Job(model_preset(preset), Cluster(nodes, gpn), Workload(seq_len, mbs), tp, pp, dp)


@pytest.fixture
def job() -> Job:
    return make_job()
