"""Bad input to the real `resihp` command: exit 2 within 5 s, exactly one line on stderr naming the
path or key, no traceback, no process left behind (a `train` mistake fails before any worker
process is spawned, which is what makes it fast).

Each case runs `python -m resihp.cli.main ...` in its own session; after it exits, nothing may be
left in that session's process group.
"""

import json
import os
import subprocess
import sys
import time

import pytest

from resihp.runtime.state.dirlock import acquire

SCENARIO = """
[model]
preset = "llama2-7b"
[cluster]
nodes = 2
gpus_per_node = 8
gpu = "a100-80g"
[parallel]
tp = 4
dp = 2
pp = 2
microbatches = 8
seq_len = 8192
[run]
duration_s = 3600
"""
GENERATOR = 'faults = {{ generator = "{name}", interval_s = {interval} }}\n'
STOP = "[[faults]]\nkind = 'stop'\ndevice = {d}\n{key} = {at}\n"
BAD_BYTES = b"\xff\xfe not utf-8 [run]\n"


def _files(tmp) -> dict[str, str]:
    """Every input a case names, written once into `tmp`."""
    files = {
        "scenario.toml": SCENARIO,
        "gen.toml": GENERATOR.format(name="poisson", interval=60) + SCENARIO,
        "interval0.toml": GENERATOR.format(name="stop-every", interval=0) + SCENARIO,
        "dupstop.toml": SCENARIO + STOP.format(d=3, key="at_s", at=5) + STOP.format(d=3, key="at_s", at=9),
        "invalid.toml": "[run\niterations = 5\n",
        "cfg_faults.toml": "[run]\nfaults = 'missing-faults.toml'\n",
        "cfg_trace.toml": "[run]\ntrace = 'no-such-dir/trace.jsonl'\n",
        "late.toml": STOP.format(d=1, key="at_iter", at=7),
        "inf.toml": STOP.format(d=1, key="at_s", at="inf"),
        "link.toml": "[[faults]]\nkind = 'link'\nsrc = 0\ndst = 2\nat_iter = 1\nseverity = 0.5\n",
        "notjson.json": "{ iterations: 3",
        "noiter.json": json.dumps({"config": {}, "events": []}),
        "nokind.json": json.dumps({"iterations": [], "events": [{"iter": 3}]}),
        "trace.jsonl": "",
    }
    for name, text in files.items():
        (tmp / name).write_text(text)
    (tmp / "binary.toml").write_bytes(BAD_BYTES)
    (tmp / "binary.jsonl").write_bytes(BAD_BYTES)
    (tmp / "a-dir").mkdir()
    (tmp / "held").mkdir()
    names = [*files, "binary.toml", "binary.jsonl", "a-dir", "held"]
    return {k.replace(".", "_").replace("-", "_"): str(tmp / k) for k in names}


# name -> (argv after `resihp`, with {file} placeholders, text the one stderr line must contain)
CASES = {
    "train --config missing": (
        ["train", "--config", "{tmp}/nope.toml"],
        "--config {tmp}/nope.toml: no such file",
    ),
    "train --config a directory": (
        ["train", "--config", "{a_dir}"],
        "is a directory",
    ),
    "train --config not UTF-8": (
        ["train", "--config", "{binary_toml}"],
        "{binary_toml}: not UTF-8 text",
    ),
    "train --config invalid TOML": (
        ["train", "--config", "{invalid_toml}"],
        "{invalid_toml}: not valid TOML",
    ),
    "train run.faults missing": (
        ["train", "--config", "{cfg_faults_toml}"],
        "run.faults missing-faults.toml",
    ),
    "train run.trace into a missing dir": (
        ["train", "--config", "{cfg_trace_toml}"],
        "run.trace no-such-dir",
    ),
    "train --faults a directory": (
        ["train", "--faults", "{a_dir}"],
        "--faults {a_dir}: is a directory",
    ),
    "train --json into a missing dir": (
        ["train", "--json", "{tmp}/x/run.json"],
        "--json {tmp}/x/run.json: dir",
    ),
    "train --trace unwritable": (
        ["train", "--trace", "/proc/resihp-trace.jsonl"],
        "--trace /proc/resihp-trace",
    ),
    "train --checkpoint-dir a file": (
        ["train", "--checkpoint-dir", "{late_toml}"],
        "is a file, not a directory",
    ),
    "train --checkpoint-dir held": (
        ["train", "--checkpoint-dir", "{held}"],
        "{held}: in use by the run of pid",
    ),
    "train fault after the end": (
        ["train", "--iterations", "5", "--faults", "{late_toml}"],
        "at_iter < 5",
    ),
    "train at_s = inf": (
        ["train", "--faults", "{inf_toml}"],
        "faults.at_s = inf",
    ),
    "train link fault, no link model": (
        ["train", "--faults", "{link_toml}"],
        "set run.link_mb_per_s > 0",
    ),
    "plan scenario missing": (
        ["plan", "{tmp}/nope.toml"],
        "scenario {tmp}/nope.toml: no such file",
    ),
    "plan scenario a directory": (
        ["plan", "{a_dir}"],
        "scenario {a_dir}: is a directory",
    ),
    "plan unknown generator": (
        ["plan", "{gen_toml}"],
        "faults.generator = 'poisson': unknown",
    ),
    "plan interval_s 0": (
        ["plan", "{interval0_toml}"],
        "faults.interval_s = 0: must be a number > 0",
    ),
    "plan duplicate stop": (
        ["plan", "{dupstop_toml}"],
        "device 3 is already dead",
    ),
    "plan --at-s nan": (
        ["plan", "{scenario_toml}", "--at-s", "nan"],
        "--at-s nan",
    ),
    "simulate not UTF-8": (
        ["simulate", "{binary_toml}"],
        "scenario {binary_toml}: not UTF-8",
    ),
    "simulate duplicate stop": (
        ["simulate", "{dupstop_toml}"],
        "device 3 is already dead",
    ),
    "simulate --plot unwritable": (
        ["simulate", "{scenario_toml}", "--plot", "/proc/p.png"],
        "--plot /proc/p.png",
    ),
    "detect --scenario invalid TOML": (
        ["detect", "--scenario", "{invalid_toml}"],
        "--scenario {invalid_toml}",
    ),
    "detect --trace a directory": (
        ["detect", "--trace", "{a_dir}"],
        "--trace {a_dir}: is a directory",
    ),
    "detect --trace not UTF-8": (
        ["detect", "--trace", "{binary_jsonl}"],
        "--trace {binary_jsonl}: not UTF-8",
    ),
    "detect --json into a missing dir": (
        ["detect", "bench", "--json", "{tmp}/x/d.json"],
        "--json {tmp}/x/d.json",
    ),
    "report missing": (
        ["report", "{tmp}/nope.json"],
        "run file {tmp}/nope.json: no such file",
    ),
    "report not JSON": (
        ["report", "{notjson_json}"],
        "{notjson_json}: not JSON",
    ),
    "report no iterations": (
        ["report", "{noiter_json}"],
        "no 'iterations' list",
    ),
    "report event without kind": (
        ["report", "{nokind_json}"],
        "events[0].kind = None",
    ),
    "report --plot a directory": (
        ["report", "{noiter_json}", "--plot", "{a_dir}"],
        "--plot {a_dir}: is a dir",
    ),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad")
    paths = _files(tmp)
    paths["tmp"] = str(tmp)
    with acquire(paths["held"]):  # a live run (this process) holds the directory
        yield paths


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_exits_2_with_one_line(name, files):
    argv, expected = CASES[name]
    argv = [a.format(**files) for a in argv]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "resihp.cli.main", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=files["tmp"],
        start_new_session=True,
    )
    try:
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    elapsed = time.perf_counter() - t0
    lines = err.strip().splitlines()
    assert proc.returncode == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("resihp: error: ") and expected.format(**files) in lines[0], lines[0]
    assert elapsed < 5.0, f"took {elapsed:.1f} s"
    assert not _group_alive(proc.pid), "a process of the command is still running"


def test_plan_and_simulate_word_a_bad_scenario_alike(files):
    """`plan` and `simulate` share one scenario validation: the same line for the same file."""
    out = [
        subprocess.run(
            [sys.executable, "-m", "resihp.cli.main", cmd, files[f]], capture_output=True, text=True
        )
        for f in ("gen_toml", "interval0_toml", "dupstop_toml")
        for cmd in ("plan", "simulate")
    ]
    assert all(o.returncode == 2 for o in out)
    assert [o.stderr for o in out[::2]] == [o.stderr for o in out[1::2]]
