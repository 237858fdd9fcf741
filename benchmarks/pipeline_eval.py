"""Time the DAG pipeline simulator on the issue's two reference layouts (issue 2 acceptance).

LLaMA 2-70B at (TP 4, DP 4, PP 16), 1F1B, 64 micro-batches per replica of GitHub-like lengths
(target <= 20 ms per evaluation); a 16,384-GPU layout (TP 8, PP 16, DP 128, 128 micro-batches per
replica; target <= 2 s). "cold" includes building the Program's cached dependency structure (a new
plan); "warm" re-evaluates the same Program with another iteration's lengths (what a policy or the
job simulator does when sampling iterations). Run: .venv/bin/python benchmarks/pipeline_eval.py
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from resihp.core import Cluster, Plan, Workload, model_preset
from resihp.core.program import compile_plan
from resihp.cost import build_costs
from resihp.evaluator.pipeline import evaluate

CASES = [
    ("llama2-70b (4,4,16) m=64", "llama2-70b", 4, 16, 4, 64, 32, 8, 0.020),
    ("llama3-405b 16,384 GPUs (8,16,128) m=128", "llama3-405b", 8, 16, 128, 128, 2048, 8, 2.0),
]


def bench(name, preset, tp, pp, dp, m, nodes, gpn, target, repeats=5):
    model = model_preset(preset)
    cluster = Cluster(nodes, gpn, "h100" if preset.startswith("llama3") else "a100-80g")
    workload = Workload(8192, m, "github", seed=0)
    t0 = time.perf_counter()
    plan = Plan.uniform(model, tp, pp, dp, m)
    program = compile_plan(plan)
    t_compile = time.perf_counter() - t0
    batches = [workload.pack(it, plan.global_microbatches) for it in range(repeats + 1)]
    tokens = np.full(plan.global_microbatches, 8192.0)
    t0 = time.perf_counter()
    costs = [build_costs(model, plan, cluster, tokens, b.sum_sq) for b in batches]
    t_costs = (time.perf_counter() - t0) / len(batches)
    t0 = time.perf_counter()
    first = evaluate(program, costs[0])
    cold = time.perf_counter() - t0
    warm = []
    for c in costs[1:]:
        t0 = time.perf_counter()
        evaluate(program, c)
        warm.append(time.perf_counter() - t0)
    w = statistics.median(warm)
    verdict = "meets" if cold <= target else ("warm meets" if w <= target else "MISSES")
    print(f"{name}: compile {t_compile * 1e3:.1f} ms, build_costs {t_costs * 1e3:.1f} ms, "
          f"evaluate cold {cold * 1e3:.1f} ms, warm median {w * 1e3:.1f} ms "
          f"(target {target * 1e3:.0f} ms: {verdict}); iteration {first.iteration_s:.2f} s")  # fmt: skip


if __name__ == "__main__":
    for case in CASES:
        bench(*case)
