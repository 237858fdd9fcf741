"""Several policies through one scenario: the JSON of `resihp simulate` (architecture §5.2)."""

from __future__ import annotations

import json
from dataclasses import replace

from resihp.core.scenario import Scenario

from .job import PolicyRun, fault_free_samples_per_s, horizon_s, scenario_faults, simulate, with_seed
from .timing import PlanTimer

NOT_BUILT = "not built yet"


def policy_registry() -> dict:
    """Every policy name -> class: the scheduler's `POLICIES` (which includes the baselines)."""
    from resihp.sched import POLICIES
    from resihp.sched.baselines import BASELINES

    return {**BASELINES, **POLICIES}


def simulate_scenario(scenario: Scenario, policy_names, seed: int | None = None) -> dict:
    """`{"scenario", "seed", "duration_s", "fault_free_samples_per_s", "policies": {name: run}}`.

    A name that is not registered gets `{"status": "not built yet"}`; unknown-looking names are
    treated the same way so a comparison never stubs a missing policy.
    """
    seed = scenario.job.workload.seed if seed is None else seed
    scenario = with_seed(scenario, seed)
    registry = policy_registry()
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
        if name not in registry:
            out["policies"][name] = {"status": NOT_BUILT}
            continue
        run: PolicyRun = simulate(fixed, registry[name](), seed, timer)
        out["policies"][name] = run.to_dict()
    return out


def dumps(result: dict) -> str:
    """Canonical JSON text (sorted keys): the same result always gives the same bytes."""
    return json.dumps(result, sort_keys=True, indent=1)
