"""One `resihp` replan kind of benchmarks/sched_latency.py run N times, for instruction counts.

The shared machine's load moves wall and CPU times by more than the changes being judged;
`valgrind --tool=callgrind` counts instructions, which load does not change. The driver builds the
256-GPU job (LLaMA 2-70B at (4,4,16)), makes one warm-up call (as the benchmark does), then N
calls, each after `forget_compiled()` and `forget_inflow()` (as the benchmark: a replan compiles
its candidates and prices their state movement afresh). Per-call instructions = (count at N=2 -
count at N=0) / 2:

    valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        .venv/bin/python benchmarks/sched_replan.py stop 0      # then 2; kinds: stop, slow, before
    .venv/bin/python benchmarks/sched_replan.py before 1 --profile   # cProfile of the N calls

`stop`: one device dies; `slow`: one device at p = 0.5; `before`: that fail-slow call with
`before=` (the runtime's call, which also re-prices the rivals on the cluster before the fault).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from sched_latency import CASES, batches  # noqa: E402

from resihp.core import Cluster, Workload, model_preset  # noqa: E402
from resihp.core.program import forget_compiled  # noqa: E402
from resihp.core.scenario import Job  # noqa: E402
from resihp.core.transfer_volume import forget_inflow  # noqa: E402
from resihp.sched import PlanningContext, ResiHP  # noqa: E402

KINDS = {"stop": "fail-stop", "slow": "fail-slow", "before": "fail-slow"}


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[0] not in KINDS or not argv[1].isdigit():
        got = " ".join(argv[:2]) or "(nothing)"
        allowed = ", ".join(KINDS)
        print(f"arguments = {got!r}: need KIND N [--profile], KIND one of {allowed}, N >= 0", file=sys.stderr)
        sys.exit(2)
    kind, n = argv[0], int(argv[1])
    _, preset, tp, pp, dp, m, nodes, gpn, gpu, _ = CASES[0]
    job = Job(model_preset(preset), Cluster(nodes, gpn, gpu), Workload(8192, m), tp, pp, dp)
    ctx = PlanningContext.of_job(job)
    cluster, reports = batches(job.cluster)[KINDS[kind]]
    kw = {"before": job.cluster} if kind == "before" else {}
    policy = ResiHP()
    decision = policy.adapt(ctx, ctx.home, cluster, reports, **kw)  # warm-up, as the benchmark
    profile = None
    if "--profile" in argv:
        import cProfile

        profile = cProfile.Profile()
        profile.enable()
    for _ in range(n):
        forget_compiled()
        forget_inflow()
        decision = policy.adapt(ctx, ctx.home, cluster, reports, **kw)
    if profile is not None:
        import pstats

        profile.disable()
        pstats.Stats(profile).sort_stats("cumulative").print_stats(40)
    print(decision.reason, decision.predicted_iteration_s)


if __name__ == "__main__":
    main(sys.argv[1:])
