"""The detector accuracy protocol of issue 5 in full, plus the per-update overhead (docs/detector.md).

400 jobs per setting × {8K, 16K, 32K tokens} × {github, c4} × {W, M, S, link}, 300 iterations each,
seed 8 (configuration chosen on seed 100; docs/detector.md tells the seed history: run 1 on seed 7).
Writes the JSON and prints a markdown table per setting. Takes minutes; `--workers` splits the six
(tokens, lengths) pairs over processes without changing a byte of the result.

Run: .venv/bin/python benchmarks/detect_bench.py [--jobs 400] [--seed 8] [--workers 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from resihp.detect.bench import BenchConfig, run_bench
from resihp.detect.overhead import update_time


def fmt(x) -> str:
    return "–" if x is None else f"{x:g}"


KEYS = ("accuracy", "false_alarms_per_job", "median_latency_iters", "localization_accuracy",
        "severity_within_10pct")  # fmt: skip


def table(out: dict) -> str:
    names = list(out["detectors"])
    head = " | ".join(f"{n}: acc / false per job / median lat / loc / sev≤10%" for n in names)
    lines = [f"| tokens | lengths | fault | MTP % | ITP % | {head} |", "|" + "---|" * (5 + len(names))]
    total = {"seq_len": "all", "lengths": "", "fault": "", "detectors": out["detectors"]}
    total.update(mtp_mape_pct=out["mtp_mape_pct"], itp_mape_pct=out["itp_mape_pct"])
    for s in [*out["settings"], total]:
        cells = [" / ".join(fmt(s["detectors"][n][k]) for k in KEYS) for n in names]
        row = [s["seq_len"], s["lengths"], s["fault"], s["mtp_mape_pct"], s["itp_mape_pct"], *cells]
        lines.append("| " + " | ".join(str(c) for c in row) + " |")
    for o in out.get("overhead", []):
        lines.append(f"\nupdate at {o['devices']} devices: {o['update_ms']} ms = "
                     f"{o['share_of_iteration_pct']}% of a {o['iteration_s']} s iteration")  # fmt: skip
    return "\n".join(lines)


def progress(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), msg, file=sys.stderr, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=400)
    ap.add_argument("--seed", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", default="detect_bench.json")
    ap.add_argument("--table-only", action="store_true", help="print the table of an existing --json")
    args = ap.parse_args()
    if args.table_only:
        with open(args.json) as fh:
            print(table(json.load(fh)))
        return 0
    t0 = time.perf_counter()
    cfg = BenchConfig(jobs=args.jobs, seed=args.seed)
    out = run_bench(cfg, progress, args.workers)
    wall = time.perf_counter() - t0
    out["overhead"] = [update_time(n) for n in (256, 16384)]
    with open(args.json, "w") as fh:
        fh.write(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"{args.jobs} jobs per setting, seed {args.seed}, {wall:.0f} s\n")
    print(table(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
