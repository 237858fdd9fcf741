"""Fingerprints of the `resihp` policy's decisions, to show a speed-up changed none of them.

For the replan latency benchmark's job (benchmarks/sched_latency.py: LLaMA 2-70B at (4,4,16) on
256 GPUs) and the jobs of a few paper scenarios (scenarios/paper/), every fault batch of
`sched_latency.batches` (fail-stop, fail-slow, mixed), once plain and once with `before` (the
runtime's call): one line per call with the SHA-256 of the whole Decision (plan, reconfiguration,
predicted iteration time, reason, prompted, the weighed candidates), as its repr prints it, and
the chosen label. Run it on two versions of the code and compare the outputs (`diff`): equal
lines mean equal decisions, bit for bit (the floats are printed by repr, exactly).

Run: .venv/bin/python benchmarks/sched_decisions.py [scenario.toml ...]
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from sched_latency import CASES, batches  # noqa: E402

from resihp.core import Cluster, Workload, model_preset  # noqa: E402
from resihp.core.scenario import Job, load_scenario  # noqa: E402
from resihp.sched import PlanningContext, ResiHP  # noqa: E402

SCENARIOS = [
    "scenarios/paper/table6/llama2-13b-stop-1h.toml",
    "scenarios/paper/table6/qwen2.5-32b-stop-1h.toml",
    "scenarios/paper/fig9/llama2-30b-slow-M.toml",
    "scenarios/paper/fig10/qwen2.5-14b-mixed-1h.toml",
    "scenarios/paper/fig10/llama2-7b-mixed-2h.toml",
]


def jobs(paths: list[str]):
    name, preset, tp, pp, dp, m, nodes, gpn, gpu, _ = CASES[0]
    yield name, Job(model_preset(preset), Cluster(nodes, gpn, gpu), Workload(8192, m), tp, pp, dp)
    for path in paths:
        yield Path(path).stem, load_scenario(str(ROOT / path)).job


def main(argv: list[str]) -> None:
    for name, job in jobs(argv or SCENARIOS):
        ctx = PlanningContext.of_job(job)
        for kind, (cluster, reports) in batches(job.cluster).items():
            for kw in ({}, {"before": job.cluster}):
                d = ResiHP().adapt(ctx, ctx.home, cluster, reports, **kw)
                digest = hashlib.sha256(repr(d).encode()).hexdigest()[:16]
                print(f"{name:38s} {kind:9s} {'+before' if kw else 'plain':7s} {digest}  {d.reason}")


if __name__ == "__main__":
    main(sys.argv[1:])
