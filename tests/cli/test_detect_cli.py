"""`resihp detect`: exit codes, one-line errors naming the line, §5.4 JSON keys."""

import json

import pytest

from resihp.cli.main import main

SCENARIO = """
name = "detect-cli"
[model]
preset = "llama2-7b"
[cluster]
nodes = 1
gpus_per_node = 4
[parallel]
tp = 2
dp = 1
pp = 2
microbatches = 4
seq_len = 8192
[run]
iterations = 90
[[faults]]
kind = "slow"
at_iter = 60
device = 2
severity = 0.5
"""


@pytest.fixture()
def scenario(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO)
    return str(path)


def test_scenario_json_lists_detections_side_by_side(scenario, tmp_path, capsys):
    """`detect --scenario` exits 0 and its JSON has both detectors, the truth, and the blamed device."""
    out = tmp_path / "d.json"
    assert main(["detect", "--scenario", scenario, "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert {"resihp", "greyhound"} <= set(data["detectors"])
    assert data["truth"][0]["devices"] == [2]
    assert data["detectors"]["resihp"]["reports"][0]["devices"] == [2]
    assert "resihp" in capsys.readouterr().out


def test_bench_json_has_the_contract_keys_and_is_deterministic(tmp_path):
    """`detect bench` twice writes byte-identical JSON with the §5.4 keys per detector."""
    args = ["detect", "bench", "--jobs", "4", "--iters", "130", "--seed", "2", "--seq-lens", "8192",
            "--lengths", "c4", "--faults", "S"]  # fmt: skip
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert main([*args, "--json", str(a)]) == 0
    assert main([*args, "--json", str(b)]) == 0
    assert a.read_bytes() == b.read_bytes()
    data = json.loads(a.read_text())
    assert data["jobs"] == 4 and data["seed"] == 2
    for name in ("resihp", "greyhound"):
        keys = {"accuracy", "false_alarms_per_job", "median_latency_iters", "localization_accuracy"}
        assert keys <= set(data["detectors"][name])


@pytest.mark.parametrize(
    "argv,message",
    [(["detect"], "give --scenario"),
     (["detect", "--scenario", "/nonexistent.toml"], "--scenario /nonexistent.toml: no such file"),
     (["detect", "--trace", "/nonexistent.jsonl"], "--trace /nonexistent.jsonl: no such file"),
     (["detect", "bench", "--jobs", "1"], "--jobs"),
     (["detect", "bench", "--faults", "XL"], "allowed"),
     (["detect", "bench", "--seq-lens", "1000"], "allowed")],
)  # fmt: skip
def test_user_errors_exit_2_with_one_line(argv, message, capsys):
    """Bad input exits 2 with one error line on stderr."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and err[-1].startswith("resihp: error:")


def test_malformed_trace_exits_2_naming_the_line(tmp_path, capsys):
    """A trace with a broken second line exits 2 and the message names line 2."""
    path = tmp_path / "t.jsonl"
    good = {"iter": 0, "generation": 0, "device": 0, "replica": 0, "stage": 0, "tp_rank": 0, "wall_s": 0.1,
            "compute_s": 0.1, "comm_s": 0.0, "instrs": [["F", 0, 0, 0.1, 0.0]]}  # fmt: skip
    path.write_text(json.dumps(good) + '\n{"iter": 0,\n')
    assert main(["detect", "--trace", str(path)]) == 2
    assert "t.jsonl:2: malformed JSON" in capsys.readouterr().err
