"""Node agents (`agent.py`): a member's death is reported by its agent, a dead agent is a dead node.

One spawn, several checks; the oracle is `train_reference`. The agents' bookkeeping without
processes is tested in `test_liveness.py`.
"""

import multiprocessing as mp
import os
import signal

import pytest

from resihp.core.faults import FaultSpec
from resihp.core.model_spec import ModelSpec
from resihp.core.plan import Plan
from resihp.runtime import JobSpec
from resihp.runtime.config import TrainConfig
from resihp.runtime.control.controller import launch_elastic
from resihp.runtime.control.pids import alive
from resihp.runtime.reference import reference_for
from resihp.runtime.train import iteration_row

pytestmark = pytest.mark.slow

SPEC = ModelSpec("t", 4, 32, 8, 2, 48, 256)


def _agent_pids(node: int) -> list[int]:
    return [p.pid for p in mp.active_children() if p.name == f"resihp-agent-{node}"]


def test_member_death_node_death_and_a_rejoin_on_a_new_agent():
    """Two nodes of two devices (tp1 x pp2 x dp2: replica 1 on node 1). Device 3 exits at iteration
    1: its agent reports the exit (cause "exit"). Node 1's agent is SIGKILLed after iteration 2
    commits: its surviving device 2 is fenced and lost with it (cause "node"), replica 0 runs
    everything. Devices 2 and 3 re-join at iteration 4 through a fresh agent of node 1 and the
    initial layout returns. The committed losses equal the reference, every process (three agents,
    six members) is accounted for and none survives."""
    config = TrainConfig(seq_len=32, microbatches=2, iterations=6)
    plan = Plan.uniform(SPEC, 1, 2, 2, 2)
    job = JobSpec(spec=SPEC, workload=config.workload(), optim=config.optim(), iterations=config.iterations)
    faults = (
        FaultSpec("stop", at_iter=1, device=3),
        FaultSpec("rejoin", at_iter=4, device=2),
        FaultSpec("rejoin", at_iter=4, device=3),
    )
    rows, killed = [], []

    def on_commit(it: int, current: Plan, reached: list) -> None:
        rows.append(iteration_row(current, config.seq_len, it, reached))
        if it == 2:
            killed.extend(_agent_pids(1))
            os.kill(killed[0], signal.SIGKILL)

    res = launch_elastic(plan, job, faults=faults, on_commit=on_commit, devices_per_node=2)
    ref, _ = reference_for(plan, config, iterations=6)
    assert [r["iter"] for r in rows] == list(range(6))
    assert [r["loss"] for r in rows] == pytest.approx(ref, rel=1e-4)
    stops = [(e["iter"], e["devices"], e["cause"]) for e in res["events"] if e["kind"] == "fail-stop"]
    assert stops == [(1, [3], "exit"), (3, [2], "node")]
    assert [(e["iter"], e["devices"]) for e in res["events"] if e["kind"] == "rejoin"] == [(4, [2, 3])]
    assert all(2 not in p.devices() and 3 not in p.devices() for p in res["plans"][2:-1])
    assert res["plans"][-1].replicas == plan.replicas and rows[-1]["generation"] == len(res["plans"]) - 1
    assert len(killed) == 1 and killed[0] in res["pids"]
    assert len(res["pids"]) == 9, res["pids"]  # agents of nodes 0, 1, 1 again; members 0-3, then 2, 3
    assert alive(res["pids"]) == [], "orphan processes"
