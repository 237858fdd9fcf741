"""How fast `resihp train` stops on a signal: signal -> the main process's exit, and -> the last
process of the job gone (every process of the job holds the stderr pipe: its end of file).

A 4-worker job (tiny LLaMA, tp 1 x pp 2 x dp 2, 2 micro-batches of 32 tokens per replica) runs in
its own session; once it printed its second iteration, SIGINT or SIGTERM goes to the whole process
group (as a terminal or a service manager sends it), SIGKILL to the main process only:

    .venv/bin/python benchmarks/stop_signals.py [--repeats 2] [--json OUT]

The issue's targets: SIGINT / SIGTERM stop the job within 2 s (exit 130 / 143), nothing left 5 s
after a SIGKILL of the main process.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

CONFIG = """
[parallel]
tp = 1
pp = 2
dp = 2
microbatches = 2
seq_len = 32
[run]
workers = 4
iterations = 100000
detect_slow = false
"""


def measure(sig: signal.Signals, tmp: str) -> dict:
    path = os.path.join(tmp, "job.toml")
    with open(path, "w") as f:
        f.write(CONFIG)
    cmd = [
        sys.executable,
        "-m",
        "resihp.cli.main",
        "train",
        "--config",
        path,
        "--json",
        os.path.join(tmp, "r.json"),
    ]
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    while not proc.stderr.readline().startswith("iter 2/"):
        pass
    t0 = time.monotonic()
    if sig is signal.SIGKILL:
        os.kill(proc.pid, sig)
    else:
        os.killpg(proc.pid, sig)
    proc.wait()
    exit_s = time.monotonic() - t0
    after = proc.stderr.read()
    gone_s = time.monotonic() - t0
    return {
        "signal": sig.name, "exit_code": proc.returncode, "exit_s": round(exit_s, 3),
        "all_gone_s": round(gone_s, 3), "stderr_lines": len(after.splitlines()),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
                runs.append(measure(sig, tmp))
                print("  ".join(f"{k} {v}" for k, v in runs[-1].items()), flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(runs, f, indent=1)


if __name__ == "__main__":
    main()
