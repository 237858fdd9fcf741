"""Wall-clock cost of the job simulator (docs/benchmarks.md).

    python benchmarks/bench_job.py [SCENARIO] [--policies a b ...]

Default: the Fig. 14 scenario (LLaMA 2-70B, 256 GPUs, ~10,000 iterations) for all ten policies.
The 16,384-GPU, 24-hour Llama 3-rates scenario is scenarios/bench/llama3-70b-16k-24h.toml.
Faults are generated once and shared, like `simulate_scenario` does.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from resihp.core.scenario import load_scenario  # noqa: E402
from resihp.sched import POLICIES  # noqa: E402
from resihp.sim.job import scenario_faults, simulate, with_seed  # noqa: E402
from resihp.sim.timing import PlanTimer  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", nargs="?", default=str(ROOT / "scenarios/paper/fig14/llama2-70b-large.toml"))
    ap.add_argument("--policies", nargs="*", default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    s = with_seed(load_scenario(args.scenario), args.seed)
    start = time.time()
    timer = PlanTimer(s.job, args.seed)
    t0 = timer.iteration_s(s.job.initial_plan(), s.job.cluster)
    s = replace(s, faults=tuple(scenario_faults(s, timer, args.seed, t0)), generator={})
    print(f"{s.name}: {len(s.faults)} faults, t0 = {t0:.2f} s, setup {time.time() - start:.1f} s", flush=True)
    for name in args.policies or list(POLICIES):
        t = time.time()
        run = simulate(s, POLICIES[name](), args.seed, timer)
        print(
            f"  {name:20s} {run.samples_per_s:9.3f} samples/s  bound {run.capacity_bound_samples_per_s:9.3f}"
            f"  {'aborted ' if run.aborted else ''}{time.time() - t:6.1f} s",
            flush=True,
        )
    print(f"total {time.time() - start:.1f} s")


if __name__ == "__main__":
    main()
