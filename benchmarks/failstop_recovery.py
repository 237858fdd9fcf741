"""Fail-stop recovery time on CPU: kill -> first committed iteration on the new plan, broken down.

The default job (tiny LLaMA, tp 2 x pp 2 x dp 2, 8 gloo workers, 1F1B, 4 micro-batches of 128
tokens per replica); device 5 (TP rank 1 of replica 1's first stage) stops at iteration 4. Prints
the `recovery` breakdown of the (last) fail-stop event (docs/runtime.md), one run per repeat:

    .venv/bin/python benchmarks/failstop_recovery.py [--repeats 3] [--json OUT] [--fault KIND]

`--fault hang`: device 5 freezes instead (SIGSTOP; found by its heartbeat timeout); `--fault join`:
device 5 exits and device 4 exits while joining the generation that replaces it (a second death
during the rebuild; `kill_to_commit_s` counts from the first).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

from resihp.runtime.config import TrainConfig
from resihp.runtime.train import run_training

KEYS = (
    "kill_to_commit_s",
    "detect_s",
    "quiesce_s",
    "plan_s",
    "teardown_s",
    "group_s",
    "transfer_s",
    "build_s",
)


FAULTS = {
    "stop": "[[faults]]\nkind = 'stop'\ndevice = 5\nat_iter = {k}\n",
    "hang": "[[faults]]\nkind = 'stop'\ndevice = 5\nat_iter = {k}\nhang = true\n",
    "join": "[[faults]]\nkind = 'stop'\ndevice = 5\nat_iter = {k}\n"
    "[[faults]]\nkind = 'stop'\ndevice = 4\nat_iter = {k}\nphase = 'join'\n",
}


def measure(at_iter: int = 4, iterations: int = 8, fault: str = "stop") -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "faults.toml")
        with open(path, "w") as f:
            f.write(FAULTS[fault].format(k=at_iter))
        res = run_training(TrainConfig(iterations=iterations, faults=path), progress=False)
    stop = [e for e in res["events"] if e["kind"] == "fail-stop"][-1]
    rows = res["iterations"]
    return {
        **stop["recovery"],
        "iteration_s": sum(r["time_s"] for r in rows[1:at_iter]) / max(1, at_iter - 1),
        "rerun_s": rows[at_iter]["time_s"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", dest="json_out")
    ap.add_argument("--fault", choices=sorted(FAULTS), default="stop")
    args = ap.parse_args()
    runs = [measure(fault=args.fault) for _ in range(args.repeats)]
    cols = (*KEYS, "iteration_s", "rerun_s")
    print("  ".join(f"{c:>12}" for c in cols))
    for r in runs:
        print("  ".join(f"{r[c]:12.3f}" for c in cols))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(runs, f, indent=1)


if __name__ == "__main__":
    main()
