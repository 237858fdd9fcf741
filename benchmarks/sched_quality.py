"""Scheduler quality: predicted throughput as a fraction of the capacity bound (issue 3 acceptance).

For random fault states on the paper's layouts (LLaMA 2 7B/13B/30B and Qwen 2.5 7B/14B/32B at
(TP, DP, PP) = (4, 2, 2/4/8), LLaMA 2-70B at (4, 4, 16); A100-80GB, 8K tokens, 2·PP micro-batches
per replica) each policy adapts the initial plan, and we report

    (X_policy / X_0) / (sum of live speed factors / N)

where X_0 is the fault-free throughput of the initial plan (resihp.evaluator.predict) and the
denominator is the capacity bound of cost-model.md §10. "none" evaluates the initial plan on the
faulty cluster (fail-slow only). `resihp` runs with horizon_s = inf (throughput only, no
reconfiguration amortization). Also runs the optimality check of the combinatorial core against
branch and bound (resihp.sched.exact) on 200 small instances.

Run: .venv/bin/python benchmarks/sched_quality.py [--states N] [--seed S]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time

from resihp.core import Cluster, Workload, model_preset
from resihp.core.scenario import Job
from resihp.evaluator.predict import predict
from resihp.sched import PlanningContext, ResiHP, ResiHPPaper
from resihp.sched.exact import exact_bottleneck, ours_bottleneck, random_instance

LAYOUTS = [
    ("llama2-7b", 2, 2),
    ("qwen2.5-7b", 2, 2),
    ("llama2-13b", 4, 2),
    ("qwen2.5-14b", 4, 2),
    ("llama2-30b", 8, 2),
    ("qwen2.5-32b", 8, 2),
    ("llama2-70b", 16, 4),
]
SEVERITIES = (0.3, 0.45, 0.65)  # unmitigated single-device loss of about 70 / 55 / 35 %


def make_job(preset: str, pp: int, dp: int) -> Job:
    n = 4 * pp * dp
    return Job(model_preset(preset), Cluster(n // 8, 8), Workload(8192, 2 * pp, "github"), 4, pp, dp)


def fault_state(job: Job, rng: random.Random, mixed: bool) -> Cluster:
    cluster = job.cluster
    n = cluster.num_devices
    for dev in rng.sample(range(n), rng.randint(1, 3)):
        cluster = cluster.with_speed(dev, rng.choice(SEVERITIES))
    if mixed:
        for dev in rng.sample(range(n), rng.randint(1, 2)):
            cluster = cluster.with_alive(dev, False)
    return cluster


def ratios(states: int, seed: int, mixed: bool):
    rng = random.Random(seed)
    jobs = {name: make_job(name, pp, dp) for name, pp, dp in LAYOUTS}
    base = {name: predict(job, job.initial_plan(), job.cluster).iteration_s for name, job in jobs.items()}
    out: dict[str, dict[str, list[float]]] = {name: {} for name in jobs}
    policies = {"resihp-paper": ResiHPPaper(), "resihp": ResiHP(horizon_s=math.inf)}
    for k in range(states):
        name = LAYOUTS[k % len(LAYOUTS)][0]
        job = jobs[name]
        cluster = fault_state(job, rng, mixed)
        bound = cluster.capacity() / cluster.num_devices
        plan0 = job.initial_plan()
        if not mixed:
            it = predict(job, plan0, cluster).iteration_s
            out[name].setdefault("none", []).append(base[name] / it / bound)
        for pname, policy in policies.items():
            d = policy.adapt(PlanningContext.of_job(job), plan0, cluster, [])
            r = 0.0 if d.aborted else base[name] / d.predicted_iteration_s / bound
            out[name].setdefault(pname, []).append(r)
    return out


def table(title: str, out) -> None:
    names = ["none", "resihp-paper", "resihp"]
    cols = [n for n in names if any(n in v for v in out.values())]
    print(f"\n{title}\n{'model':14s} {'states':>6s} " + " ".join(f"{c:>13s}" for c in cols))
    allv: dict[str, list[float]] = {c: [] for c in cols}
    for model, by in out.items():
        n = len(next(iter(by.values()), []))
        row = " ".join(f"{statistics.mean(by[c]):13.3f}" for c in cols)
        print(f"{model:14s} {n:6d} {row}")
        for c in cols:
            allv[c] += by[c]
    print(
        f"{'mean (all)':14s} {len(allv[cols[0]]):6d} "
        + " ".join(f"{statistics.mean(allv[c]):13.3f}" for c in cols)
    )
    print(f"{'min (all)':14s} {'':6s} " + " ".join(f"{min(allv[c]):13.3f}" for c in cols))


def optimality(instances: int, seed: int) -> None:
    rng = random.Random(seed)
    gaps = []
    for _ in range(instances):
        inst = random_instance(rng)
        gaps.append(ours_bottleneck(inst) / exact_bottleneck(inst) - 1.0)
    gaps.sort()
    q = lambda f: gaps[min(len(gaps) - 1, int(f * len(gaps)))]  # noqa: E731
    print(f"\nOptimality vs branch and bound, {instances} instances (<= 6 stages, <= 4 replicas, <= 16 mbs)")
    print(f"  exact: {sum(g <= 1e-9 for g in gaps) / len(gaps):.1%}   within 2%: "
          f"{sum(g <= 0.02 for g in gaps) / len(gaps):.1%}   median {q(0.5):.2%}   p95 {q(0.95):.2%}   "
          f"max {gaps[-1]:.2%}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--states", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--instances", type=int, default=200)
    args = ap.parse_args()
    t0 = time.perf_counter()
    table("Fail-slow only: throughput / capacity bound", ratios(args.states, args.seed, mixed=False))
    table(
        "Mixed (fail-slow + 1-2 fail-stops): throughput / capacity bound",
        ratios(args.states, args.seed + 1, True),
    )
    optimality(args.instances, args.seed)
    print(f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
