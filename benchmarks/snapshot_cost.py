"""Cost of in-memory peer snapshots, and recovery from losing every replica of a stage, on CPU.

Default job (tiny LLaMA, tp 2 x pp 2 x dp 2, 8 gloo workers, 1F1B, 4 micro-batches of 128 tokens
per replica) on the elastic runtime: `--iterations` with snapshots off and on, `--rounds` times
interleaved; the figures are the wall time between consecutive commits and, with snapshots, the
main thread's time waiting for the snapshot exchange per iteration (`snapshot_wait_s` of the trace
records: the mean over the 8 devices, and the slowest device's), then a run with snapshots where
devices 2, 3, 6, 7 (both copies of the last stage) stop at iteration 4: the `recovery` breakdown of
that fail-stop.

    .venv/bin/python benchmarks/snapshot_cost.py [--iterations 20] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time

from resihp.runtime import JobSpec
from resihp.runtime.config import TrainConfig
from resihp.runtime.control.controller import launch_elastic
from resihp.runtime.train import run_training


def commit_gaps(snapshots: bool, iterations: int) -> tuple[list[float], list[tuple[float, float]]]:
    """Seconds between consecutive commits from iteration 3 on (the steady wall per iteration,
    snapshot exchange and commit round trip included), and per iteration from 3 on the main
    thread's seconds waiting for the snapshot (mean over devices, slowest device)."""
    config = TrainConfig(iterations=iterations, snapshots=snapshots)
    plan = config.plan()
    job = JobSpec(plan.model, config.workload(), config.optim(), iterations=iterations, snapshots=snapshots)
    stamps: dict[int, float] = {}
    out = launch_elastic(
        plan, job, on_commit=lambda it, p, payloads: stamps.setdefault(it, time.perf_counter())
    )
    waits = []
    for i in range(3, iterations) if snapshots else ():
        w = [r["snapshot_wait_s"] for r in out["records"][i]]
        waits.append((statistics.mean(w), max(w)))
    return [stamps[i] - stamps[i - 1] for i in range(4, iterations)], waits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    print("before:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    gaps, waits = {False: [], True: []}, []
    for _ in range(args.rounds):  # interleaved: the machine's load drifts
        for snaps in (False, True):
            g, w = commit_gaps(snaps, args.iterations)
            gaps[snaps] += g
            waits += w
    for snaps, g in gaps.items():
        print(f"snapshots {'on ' if snaps else 'off'}: median {statistics.median(g) * 1e3:6.1f} ms, "
              f"mean {statistics.mean(g) * 1e3:6.1f} ms wall per commit ({len(g)} gaps)")  # fmt: skip
    mean, slowest = (statistics.median(x) * 1e3 for x in zip(*waits))
    print(f"main thread waiting for the snapshot per iteration: median {mean:.2f} ms (mean over devices), "
          f"{slowest:.2f} ms (slowest device), {len(waits)} iterations")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "faults.toml")
        with open(path, "w") as f:
            f.write("".join(f"[[faults]]\nkind = 'stop'\ndevice = {d}\nat_iter = 4\n" for d in (2, 3, 6, 7)))
        res = run_training(TrainConfig(iterations=8, faults=path, snapshots=True), progress=False)
    rec = next(e for e in res["events"] if e["kind"] == "fail-stop" and "recovery" in e)["recovery"]
    restore = [e for e in res["events"] if e["kind"] == "snapshot-restore"]
    print("snapshot-restore:", restore)
    print("recovery:", {k: round(v, 3) for k, v in rec.items()})
    print("after: ", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
