"""The command line: bad input exits 2 with one line, JSON is deterministic, traces are written."""

import json
import subprocess
import sys

import pytest

from resihp.cli.main import main

SCENARIO = """
name = "cli-test"
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


@pytest.fixture()
def scenario(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO)
    return path


def test_plan_json_is_deterministic(scenario, tmp_path, capsys):
    """`resihp plan` twice on the same scenario writes byte-identical JSON with the §5.3 keys."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert main(["plan", str(scenario), "--json", str(a)]) == 0
    assert main(["plan", str(scenario), "--json", str(b)]) == 0
    assert a.read_bytes() == b.read_bytes()
    out = json.loads(a.read_text())
    for key in ("replicas", "standby", "dead", "predicted_iteration_s", "samples_per_s",
                "capacity_bound_samples_per_s", "peak_memory_bytes"):  # fmt: skip
        assert key in out
    assert out["replicas"][0][0]["devices"] == [0, 1, 2, 3]
    assert out["samples_per_s"] == pytest.approx(16 / out["predicted_iteration_s"], rel=1e-4)
    assert "predicted iteration" in capsys.readouterr().out


def test_plan_trace(scenario, tmp_path):
    """`resihp plan --trace` writes a Chrome trace with one event per chunk."""
    path = tmp_path / "t.json"
    assert main(["plan", str(scenario), "--trace", str(path)]) == 0
    events = json.loads(path.read_text())["traceEvents"]
    assert sum(e["ph"] == "X" for e in events) == 2 * 2 * 8 * 3


@pytest.mark.parametrize(
    "old, new, key",
    [
        ("tp = 4", "tp = 3", "parallel: tp*pp*dp"),
        ("seq_len = 8192", "seq_len = 8192\nfoo = 1", "parallel.foo: unknown key"),
        ("[run]", "[[faults]]\nkind = 'stop'\nat_s = 5\ndevice = 99\n[run]", "faults[0].device = 99"),
        ('preset = "llama2-7b"', "layers = 1\nhidden = 64\nheads = 4\nffn = 64\nvocab = 64",
         "more stages than the model's 1 layers"),
        ("microbatches = 8", "microbatches = 0", "parallel.microbatches = 0"),
    ],
)  # fmt: skip
def test_bad_input_exits_2_with_one_line(tmp_path, old, new, key):
    """Bad scenarios make the CLI exit 2 with one stderr line naming the key, and no traceback."""
    path = tmp_path / "bad.toml"
    path.write_text(SCENARIO.replace(old, new, 1))
    out = subprocess.run(
        [sys.executable, "-m", "resihp.cli.main", "plan", str(path)], capture_output=True, text=True
    )
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and key in lines[0] and "Traceback" not in out.stderr


def test_unknown_policies_and_the_policy_list(scenario, capsys):
    """Unknown policy names are rejected with the allowed list; `resihp policies` lists every
    registered name, one line each, with its description."""
    from resihp.sched import POLICIES

    assert main(["simulate", str(scenario), "--policy", "magic"]) == 2
    err = capsys.readouterr().err
    assert "--policy 'magic': unknown; allowed: none, checkpoint-restart" in err
    assert main(["policies"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(POLICIES)
    assert all(len(line.split()) > 2 and "not built" not in line for line in lines)


def test_missing_file(capsys):
    """A missing scenario file is a one-line error, exit 2."""
    assert main(["plan", "/nonexistent.toml"]) == 2
    assert "scenario /nonexistent.toml: no such file" in capsys.readouterr().err
