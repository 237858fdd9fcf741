"""`resihp train` when a job stops early, and what it shows while it runs: the real command, in its
own session, on a 2- or 4-worker job.

* a failure it cannot recover from (dp 1, the only copy of a stage lost) keeps every committed
  iteration and the failure in `--json` and `--trace`, exits 2 with one line, and `resihp report`
  reads the file;
* SIGINT / SIGTERM to the whole process group stop the job in order: at most two lines on stderr,
  no traceback, exit 130 / 143, the JSON written, no process left;
* SIGKILL of the main process: its children exit within 5 s and print nothing;
* the live events: one plain line per event, in order, and the summary's counts and final layout.

After each run nothing may be left in the session (every process of a job stays in it).
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from resihp.cli.main import main

pytestmark = pytest.mark.slow

CONFIG = """
[parallel]
tp = 1
pp = 2
dp = {dp}
microbatches = 2
seq_len = 32
[run]
workers = {workers}
iterations = {iterations}
detect_slow = false
"""


def _config(tmp_path, name: str, dp: int, iterations: int) -> str:
    path = tmp_path / name
    path.write_text(CONFIG.format(dp=dp, workers=2 * dp, iterations=iterations))
    return str(path)


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "resihp.cli.main", "train", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _session(sid: int) -> list[int]:
    """The processes of session `sid` still running (zombies excluded)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] not in ("Z", "X"):
            out.append(int(entry))
    return out


def _none_left(sid: int, within_s: float = 5.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while _session(sid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _session(sid)


def test_a_lost_stage_fails_the_run_but_keeps_its_json_and_trace(tmp_path, capsys):
    """dp 1: device 1 (the only copy of layers 2-3) stops at iteration 2. Exit 2 and one line
    (--quiet: no live line) naming what was lost, what was kept and what to do; the JSON holds
    iterations 0-1, the injected stop, the fail-stop and the failure last; the trace holds every
    device's records of those iterations; `resihp report` summarizes the file."""
    faults = tmp_path / "faults.toml"
    faults.write_text("[[faults]]\nkind = 'stop'\ndevice = 1\nat_iter = 2\n")
    out_json, trace = tmp_path / "run.json", tmp_path / "trace.jsonl"
    cfg = _config(tmp_path, "dp1.toml", dp=1, iterations=6)
    proc = _start(
        "--config", cfg, "--faults", str(faults), "--json", str(out_json), "--trace", str(trace), "--quiet"
    )
    stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 2, stderr
    assert stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    assert stderr.startswith(
        "resihp: devices [1] stopped at iteration 2 and took out every copy of layers 2-3 (run.snapshots"
    )
    assert (
        f"2 committed iterations written to {out_json}; no checkpoint: rerun with --checkpoint-every"
        in stderr
    )
    assert _none_left(proc.pid) == []
    run = json.loads(out_json.read_text())
    assert run["status"] == "failed" and [r["iter"] for r in run["iterations"]] == [0, 1]
    assert [(e["iter"], e["kind"]) for e in run["events"]] == [
        (2, "inject-stop"),
        (2, "fail-stop"),
        (2, "job-failed"),
    ]
    assert run["events"][-1]["devices"] == [1] and run["events"][-1]["advice"].startswith("no checkpoint")
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    assert sorted((r["iter"], r["device"]) for r in rows) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert "events: 1 fail-stop (0 recovered), 1 inject-stop, 1 job-failed" in stdout
    capsys.readouterr()
    assert main(["report", str(out_json)]) == 0
    report = capsys.readouterr().out
    assert "2 iterations" in report and "job-failed" in report and "not recovered" in report


@pytest.mark.parametrize(
    ("sig", "code", "word"), [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")]
)
def test_a_signal_to_the_process_group_stops_the_job_in_order(tmp_path, sig, code, word):
    """Sent to the whole group (as the terminal does) once the first iteration is printed: one live
    line for the stop and one line saying what was kept, exit 128 + signal, the JSON written with
    every committed iteration and the stop as its last event, nothing left in the session."""
    out_json = tmp_path / "run.json"
    proc = _start(
        "--config", _config(tmp_path, "long.toml", dp=1, iterations=100_000), "--json", str(out_json)
    )
    first = proc.stderr.readline()
    assert first.startswith("iter 1/"), first + proc.stderr.read()
    os.killpg(proc.pid, sig)
    stdout, rest = proc.communicate(timeout=60)
    lines = rest.splitlines()
    lines = lines[next((k for k, line in enumerate(lines) if not line.startswith("iter ")), len(lines)) :]
    assert proc.returncode == code, rest
    assert len(lines) <= 2 and "Traceback" not in rest, rest
    run = json.loads(out_json.read_text())
    n = len(run["iterations"])
    assert n >= 1 and run["status"] == "interrupted"
    assert (
        run["events"][-1]["kind"] == "interrupted" and run["events"][-1]["signal"] == signal.Signals(sig).name
    )
    assert lines[-1] == f"resihp: {word}; {n} committed iteration{'s' * (n != 1)} written to {out_json}"
    assert _none_left(proc.pid) == []


def test_sigkill_of_the_main_process_leaves_quiet_children_that_exit(tmp_path):
    """Killed with SIGKILL, the main process says nothing; its children notice within seconds,
    exit without a word on the terminal (no C++ store dumps, no resource-tracker warning) and none
    is left after 5 s."""
    proc = _start("--config", _config(tmp_path, "long.toml", dp=1, iterations=100_000))
    first = proc.stderr.readline()
    assert first.startswith("iter 1/"), first + proc.stderr.read()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    left = _none_left(proc.pid)
    rest = proc.stderr.read()  # every writer of the pipe is gone by now
    lines = [line for line in rest.splitlines() if not line.startswith("iter ")]
    assert left == [] and lines == [], rest


def test_live_events_are_printed_one_line_each_in_order(tmp_path):
    """tp1 x pp2 x dp2; device 3 stops at iteration 2 and re-joins at 5, a checkpoint every 3: each
    event of the JSON (but the state transfers) is one plain line on stderr as it happens, in the
    JSON's order, and the fail-stop is followed by its recovery; a checkpoint, written in the
    background, is reported once on disk: after the progress line of its last iteration, in order
    among the checkpoints; the summary counts the events and states the final layout."""
    faults = tmp_path / "faults.toml"
    faults.write_text(
        "[[faults]]\nkind = 'stop'\ndevice = 3\nat_iter = 2\n"
        "[[faults]]\nkind = 'rejoin'\ndevice = 3\nat_iter = 5\n"
    )
    out_json = tmp_path / "run.json"
    args = ["--config", _config(tmp_path, "dp2.toml", dp=2, iterations=7), "--faults", str(faults)]
    args += ["--checkpoint-every", "3", "--checkpoint-dir", str(tmp_path / "ck"), "--json", str(out_json)]
    proc = _start(*args)
    stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stderr
    run = json.loads(out_json.read_text())
    lines = stderr.splitlines()
    shown = [line.split()[:3] for line in lines if not line.startswith("iter ")]
    want = [[e["kind"], "iter", f"{e['iter']}:"] for e in run["events"] if e["kind"] != "state-transfer"]
    assert [s for s in shown if s[0] not in ("recovered", "checkpoint")] == [
        w for w in want if w[0] != "checkpoint"
    ], stderr
    saved = [i for i, line in enumerate(lines) if line.startswith("checkpoint")]
    assert [lines[i].split()[2] for i in saved] == ["3:", "6:"], stderr
    assert all(any(ln.startswith(f"iter {k}/7 ") for ln in lines[:i]) for k, i in zip((3, 6), saved)), stderr
    assert (
        shown.index(["recovered", "iter", "2:"]) == shown.index(["fail-stop", "iter", "2:"]) + 2
    )  # after the replan
    kinds = [e["kind"] for e in run["events"]]
    assert kinds.count("checkpoint") == 2 and kinds.count("replan") == 2 and "rejoin" in kinds
    counted = "2 checkpoint, 1 fail-stop (1 recovered), 1 inject-rejoin, 1 inject-stop, 1 rejoin, 2 replan"
    assert f"events: {counted}, 2 state-transfer" in stdout
    assert (
        "final layout (generation 2, 4 devices): r0s0 [0] L0-1 heads [8]; r0s1 [1] L2-3 heads [8]; " in stdout
    )
    assert _none_left(proc.pid) == []
