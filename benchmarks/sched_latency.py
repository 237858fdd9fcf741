"""Replan latency of the scheduler policies (issue 3 acceptance).

One `adapt` call (plan, reconfiguration cost and predicted iteration time) after a mixed fault
batch: one fail-stop, one fail-slow at p = 0.5 and one at p = 0.3, on
- LLaMA 2-70B at (TP 4, DP 4, PP 16) on 256 A100s, 64 micro-batches per replica (target <= 100 ms
  for `resihp`; the paper reports 1.44 s for Qwen 2.5-32B);
- LLaMA 2-70B at (TP 8, DP 128, PP 16) on 16,384 H100s, 32 micro-batches per replica (<= 5 s).
Rows: `resihp-paper`; `resihp` (default: candidates ranked by the analytic proxy, the best two
plus the paper's plan then costed by the full ITP pass, resihp.sim.predict); `resihp plan-only`
(dag_top=0: the choice on the proxy alone, i.e. the replan without the ITP pass that prices it).
Reports the median of `repeats` calls after one warm-up call (caches of the job's initial plan
and packed batch). Before every timed call the compiled-Program memo is emptied
(`core.program.forget_compiled`), so each call compiles its candidates as a real replan does.
Run: .venv/bin/python benchmarks/sched_latency.py [--quick]
"""

from __future__ import annotations

import statistics
import sys
import time

from resihp.core import Cluster, Workload, model_preset
from resihp.core.program import forget_compiled
from resihp.core.scenario import Job
from resihp.sched import ResiHP, ResiHPPaper

CASES = [
    # name, preset, tp, pp, dp, microbatches, nodes, gpus per node, gpu, target s
    ("llama2-70b 256 GPUs (4,4,16) m=64", "llama2-70b", 4, 16, 4, 64, 32, 8, "a100-80g", 0.1),
    ("llama2-70b 16,384 GPUs (8,128,16) m=32", "llama2-70b", 8, 16, 128, 32, 2048, 8, "h100", 5.0),
]


def faulted(cluster: Cluster) -> Cluster:
    n = cluster.num_devices
    return cluster.with_alive(n // 3 + 1, False).with_speed(n // 2 + 2, 0.5).with_speed(n - 5, 0.3)


def bench(case, policies, repeats):
    name, preset, tp, pp, dp, m, nodes, gpn, gpu, target = case
    job = Job(model_preset(preset), Cluster(nodes, gpn, gpu), Workload(8192, m), tp, pp, dp)
    plan0 = job.initial_plan()
    cluster = faulted(job.cluster)
    rows = []
    for pname, policy in policies.items():
        policy.adapt(job, plan0, cluster, [])
        times = []
        for _ in range(repeats):
            forget_compiled()
            t0 = time.perf_counter()
            decision = policy.adapt(job, plan0, cluster, [])
            times.append(time.perf_counter() - t0)
        rows.append((name, pname, statistics.median(times), target, decision))
    return rows


def main(argv: list[str]) -> None:
    quick = "--quick" in argv
    print(f"{'case':42s} {'policy':17s} {'replan s':>9s} {'target s':>9s}  plan")
    for k, case in enumerate(CASES):
        repeats = 1 if (quick or k == 1) else 3
        policies = {
            "resihp-paper": ResiHPPaper(),
            "resihp": ResiHP(),
            "resihp plan-only": ResiHP(dag_top=0),
        }
        for name, pname, t, target, d in bench(case, policies, repeats):
            ok = "" if pname == "resihp-paper" else ("ok" if t <= target else "over target")
            print(
                f"{name:42s} {pname:17s} {t:9.3f} {target:9.2f}  {d.reason} "
                f"(iteration {d.predicted_iteration_s:.2f} s, pause {d.reconfig.pause_s:.1f} s) {ok}"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
