"""Replan latency of the scheduler policies (issue 3 and issue 12 acceptance).

One `adapt` call (plan, reconfiguration cost and predicted iteration time) per fault batch, with
the batch's reports, on
- LLaMA 2-70B at (TP 4, DP 4, PP 16) on 256 A100s, 64 micro-batches per replica (target <= 100 ms
  for `resihp`; the paper reports 1.44 s for Qwen 2.5-32B);
- LLaMA 2-70B at (TP 8, DP 128, PP 16) on 16,384 H100s, 32 micro-batches per replica (<= 5 s).
Fault batches: `fail-stop` (one device dies), `fail-slow` (one device at p = 0.5), `mixed` (one
fail-stop, one fail-slow at p = 0.5 and one at p = 0.3: the batch of the issue 3 figures).
Rows: `resihp-paper`; `resihp` (candidates ranked by the analytic proxy, the best few plus the
paper's plan then costed by the full ITP pass, resihp.evaluator.predict); `resihp plan-only` (dag_top=0:
the choice on the proxy alone); for fail-slow batches also `resihp +before`, the call the
runtime makes (`adapt(..., before=...)`: the candidates re-ranked on the cluster before the
reports, to tell whether they are why the plan changes). Reports the median of `repeats` calls
after one warm-up call (caches of the packed batch, memory bounds, cost tables and pipeline
structures by shape), wall clock and this process's CPU time: on a shared machine the wall clock
includes waiting for a core, the CPU time much less of it (the load average is printed too).
Before every timed call the compiled-Program memo and the transfer volumes' memo are emptied
(`core.program.forget_compiled`, `core.transfer_volume.forget_inflow`), so each call compiles and
prices its candidates as a real replan does.
Run: .venv/bin/python benchmarks/sched_latency.py [--quick] [--small] [--repeats N]
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from resihp.core import Cluster, FailureReport, Workload, model_preset
from resihp.core.program import forget_compiled
from resihp.core.scenario import Job
from resihp.core.transfer_volume import forget_inflow
from resihp.sched import PlanningContext, ResiHP, ResiHPPaper

CASES = [
    # name, preset, tp, pp, dp, microbatches, nodes, gpus per node, gpu, target s
    ("llama2-70b 256 GPUs (4,4,16) m=64", "llama2-70b", 4, 16, 4, 64, 32, 8, "a100-80g", 0.1),
    ("llama2-70b 16,384 GPUs (8,128,16) m=32", "llama2-70b", 8, 16, 128, 32, 2048, 8, "h100", 5.0),
]


def batches(cluster: Cluster) -> dict[str, tuple[Cluster, list[FailureReport]]]:
    """Fault batch name -> (cluster after it, its reports)."""
    n = cluster.num_devices
    dead, slow, slower = n // 3 + 1, n // 2 + 2, n - 5
    stop = FailureReport("fail-stop", (dead,))
    half = FailureReport("fail-slow", (slow,), severity=0.5)
    third = FailureReport("fail-slow", (slower,), severity=0.3)
    return {
        "fail-stop": (cluster.with_alive(dead, False), [stop]),
        "fail-slow": (cluster.with_speed(slow, 0.5), [half]),
        "mixed": (
            cluster.with_alive(dead, False).with_speed(slow, 0.5).with_speed(slower, 0.3),
            [stop, half, third],
        ),
    }


def bench(case, policies, repeats, kinds):
    name, preset, tp, pp, dp, m, nodes, gpn, gpu, target = case
    job = Job(model_preset(preset), Cluster(nodes, gpn, gpu), Workload(8192, m), tp, pp, dp)
    ctx = PlanningContext.of_job(job)
    rows = []
    for kind, (cluster, reports) in batches(job.cluster).items():
        if kind not in kinds:
            continue
        calls = dict(policies)
        if kind == "fail-slow":
            calls["resihp +before"] = (policies["resihp"][0], {"before": job.cluster})
        for pname, (policy, kw) in calls.items():
            policy.adapt(ctx, ctx.home, cluster, reports, **kw)
            times, cpu = [], []
            for _ in range(repeats):
                forget_compiled()
                forget_inflow()
                t0, c0 = time.perf_counter(), time.process_time()
                decision = policy.adapt(ctx, ctx.home, cluster, reports, **kw)
                times.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
            rows.append(
                (name, kind, pname, statistics.median(times), statistics.median(cpu), target, decision)
            )
    return rows


def main(argv: list[str]) -> None:
    quick, small = "--quick" in argv, "--small" in argv
    many = int(argv[argv.index("--repeats") + 1]) if "--repeats" in argv else 5
    print("load average (1, 5, 15 min): " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(f"{'case':40s} {'faults':9s} {'policy':17s} {'replan s':>9s} {'cpu s':>7s} {'target s':>9s}  plan")
    for k, case in enumerate(CASES[:1] if small else CASES):
        repeats = 1 if (quick or k == 1) else many
        policies = {
            "resihp-paper": (ResiHPPaper(), {}),
            "resihp": (ResiHP(), {}),
            "resihp plan-only": (ResiHP(dag_top=0), {}),
        }
        kinds = ("mixed",) if k == 1 else ("fail-stop", "fail-slow", "mixed")
        for name, kind, pname, t, c, target, d in bench(case, policies, repeats, kinds):
            ok = "" if pname == "resihp-paper" else ("ok" if t <= target else "over target")
            print(
                f"{name:40s} {kind:9s} {pname:17s} {t:9.3f} {c:7.3f} {target:9.2f}  {d.reason} "
                f"(iteration {d.predicted_iteration_s:.2f} s, pause {d.reconfig.pause_s:.1f} s"
                f"{'' if d.prompted else ', unprompted'}) {ok}"
            )
    print("load average (1, 5, 15 min): " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main(sys.argv[1:])
