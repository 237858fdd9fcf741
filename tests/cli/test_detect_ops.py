"""`resihp detect --ops-trace FILE --meta META [--json OUT]` end to end: a CSV trace written here,
the issue's JSON form, the table on stdout, and exit 2 with one stderr line for bad input."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "detect"))  # ops_traces, by module name

from ops_traces import synth_ops, write_csv, write_meta  # noqa: E402

from resihp.cli.main import main  # noqa: E402


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ops")
    rows = synth_ops(slow=(5, 0.41, 16), stage_s=[0.1, 0.1, 0.1, 0.16])
    return {"trace": write_csv(rows, tmp / "trace.csv"), "meta": write_meta(tmp / "meta.yaml"),
            "toml": write_meta(tmp / "meta.toml"), "tmp": tmp}  # fmt: skip


def test_csv_end_to_end_json(files, capsys):
    """Exit 0; the JSON has exactly the issue's keys, the slowed TP group and the heavy last stage."""
    out = files["tmp"] / "out.json"
    assert main(["detect", "--ops-trace", files["trace"], "--meta", files["meta"], "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert set(data) == {"ranks", "steps", "fail_slow", "stage_imbalance"}
    assert (data["ranks"], data["steps"]) == (16, 44)
    assert [(e["rank"], e["stage"], e["dp_rank"]) for e in data["fail_slow"]] == [(4, 1, 0), (5, 1, 0)]
    assert all(abs(e["speed"] - 0.41) <= 0.041 and abs(e["first_step"] - 16) <= 1 for e in data["fail_slow"])
    assert [e["stage"] for e in data["stage_imbalance"]] == [3]
    text = capsys.readouterr().out
    assert "16 ranks, 44 steps" in text and "first_step" in text and "ratio" in text


def test_json_to_stdout_is_only_json(files, capsys):
    """`--json -` prints the JSON alone (no table), and a TOML meta gives the same result."""
    assert main(["detect", "--ops-trace", files["trace"], "--meta", files["toml"], "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [e["rank"] for e in data["fail_slow"]] == [4, 5]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--ops-trace", "{trace}"], "--ops-trace FILE and --meta META go together"),
        (["--meta", "{meta}"], "--ops-trace FILE and --meta META go together"),
        (["--ops-trace", "{tmp}/nope.csv", "--meta", "{meta}"], "--ops-trace {tmp}/nope.csv: no such file"),
        (["--ops-trace", "{trace}", "--meta", "{tmp}/nope.yaml"], "--meta {tmp}/nope.yaml: no such file"),
        (["--ops-trace", "{trace}", "--meta", "{meta}", "--scenario", "x.toml"], "takes no 'bench'"),
        (["--ops-trace", "{nocol}", "--meta", "{meta}"], "missing column(s) 'duration'"),
        (["--ops-trace", "{trace}", "--meta", "{badmeta}"], "pp_size = -1: must be an integer >= 1"),
        (["--ops-trace", "{trace}", "--meta", "{meta}", "--json", "{tmp}/no/dir.json"], "does not exist"),
    ],
)
def test_bad_inputs_exit_2_with_one_line(files, capsys, args, message):
    tmp = files["tmp"]
    (tmp / "nocol.csv").write_text("rank,dp_rank,stage,step,optype,start_ts\n0,0,0,0,forward-compute,0\n")
    (tmp / "badmeta.yaml").write_text("dp_size: 2\npp_size: -1\ntp_size: 2\nworld_size: 16\n")
    names = {**files, "nocol": str(tmp / "nocol.csv"), "badmeta": str(tmp / "badmeta.yaml")}
    assert main(["detect", *(a.format(**names) for a in args)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message.format(**names) in err


@pytest.mark.skipif(importlib.util.find_spec("pyarrow") is not None, reason="pyarrow is installed")
def test_parquet_without_pyarrow_from_the_real_command(files):
    """The real command, in a fresh interpreter: exit 2, one line, no traceback."""
    path = files["tmp"] / "t.parquet"
    path.write_bytes(b"PAR1")
    cmd = [sys.executable, "-m", "resihp.cli.main", "detect", "--ops-trace", str(path)]
    cmd += ["--meta", files["meta"]]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "reading Parquet needs pyarrow" in proc.stderr


def test_ranks_without_peers_are_named_in_a_warning(tmp_path, capsys):
    """DP 1 with one rank per stage: exit 0, one warning naming the unjudged ranks."""
    rows = synth_ops(dp=1, tp=2, steps=range(12), keep=lambda r: r % 2 == 0)
    trace, meta = write_csv(rows, tmp_path / "t.csv"), write_meta(tmp_path / "m.toml", dp=1)
    assert main(["detect", "--ops-trace", trace, "--meta", meta]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "4 rank(s) not judged" in err and ": 0, 2, 4, 6" in err
