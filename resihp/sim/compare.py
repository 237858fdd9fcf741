"""Several policies through one scenario: the JSON of `resihp simulate` (architecture §5.2)."""

from __future__ import annotations

import json
from dataclasses import replace

from resihp.core.scenario import Scenario
from resihp.sched.registry import POLICIES, check_name

from .job import PolicyRun, fault_free_samples_per_s, horizon_s, scenario_faults, simulate, with_seed
from .timing import PlanTimer


def simulate_scenario(scenario: Scenario, policy_names, seed: int | None = None) -> dict:
    """`{"scenario", "seed", "duration_s", "fault_free_samples_per_s", "policies": {name: run}}`,
    each policy with its default options; ValueError for a name that is not registered."""
    for name in policy_names:
        check_name(name)
    seed = scenario.job.workload.seed if seed is None else seed
    scenario = with_seed(scenario, seed)
    timer = PlanTimer(scenario.job, seed)  # shared: plans common to several policies cost once
    job = scenario.job
    t0 = timer.iteration_s(job.initial_plan(), job.cluster)
    faults = scenario_faults(scenario, timer, seed, t0)
    fixed = replace(scenario, faults=tuple(faults), generator={})
    out = {
        "scenario": scenario.name,
        "seed": seed,
        "duration_s": round(horizon_s(fixed, t0), 3),
        "fault_free_samples_per_s": round(fault_free_samples_per_s(job, timer), 6),
        "policies": {},
    }
    for name in policy_names:
        run: PolicyRun = simulate(fixed, POLICIES[name](), seed, timer)
        out["policies"][name] = run.to_dict()
    return out


def dumps(result: dict) -> str:
    """Canonical JSON text (sorted keys): the same result always gives the same bytes."""
    return json.dumps(result, sort_keys=True, indent=1)
