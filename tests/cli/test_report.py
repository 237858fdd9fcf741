"""`resihp report`: the summary of a run JSON, its plot, its bad inputs."""

import json

import pytest

from resihp.cli.main import main
from resihp.cli.report_cmd import load_run, summarize


def _stage(devices, layers, split):
    return {"devices": devices, "layers": layers, "tp_split": split, "ffn_split": [1] * len(devices)}


PLAN0 = {
    "generation": 0,
    "standby": [],
    "replicas": [
        [_stage([0, 1], [0, 2], [4, 4]), _stage([2, 3], [2, 4], [4, 4])],
        [_stage([4, 5], [0, 2], [4, 4]), _stage([6, 7], [2, 4], [4, 4])],
    ],
}
PLAN1 = {
    "generation": 1,
    "standby": [],
    "replicas": [PLAN0["replicas"][0], [_stage([4], [0, 2], [8]), _stage([6, 7], [2, 4], [4, 4])]],
}
RECOVERY = {
    "kill_to_commit_s": 0.6,
    "detect_s": 0.05,
    "plan_s": 0.01,
    "teardown_s": 0.1,
    "group_s": 0.02,
    "transfer_s": 0.06,
    "build_s": 0.03,
}
RUN = {
    "iterations": [{"iter": k, "loss": 5.0 - 0.5 * k, "time_s": 1.0 if k == 0 else (0.5 if k < 3 else 0.25),
                    "samples": 8, "tokens": 1024, "generation": 0 if k < 3 else 1} for k in range(6)],
    "events": [
        {"iter": 3, "kind": "inject-stop", "devices": [5]},
        {"iter": 3, "kind": "fail-stop", "devices": [5], "cause": "exit", "generation": 0,
         "recovery": RECOVERY},
        {"iter": 3, "kind": "replan", "generation": 1, "devices": [0, 1, 2, 3, 4, 6, 7],
         "reason": "resihp: exclude"},
        {"iter": 4, "kind": "inject-slow", "devices": [2], "severity": 0.4},
        {"iter": 5, "kind": "fail-slow", "devices": [2], "severity": 0.35, "reason": "no better plan"},
    ],
    "summary": {"samples_per_s": 21.0},
    "plans": [PLAN0, PLAN1],
}  # fmt: skip


@pytest.fixture()
def run_file(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(RUN))
    return str(path)


def test_summary_counts_events_and_prices_each_generation(run_file):
    """Throughput per generation leaves the run's iteration 0 out; recovery time from `recovery`."""
    rep = summarize(load_run(run_file))
    assert (rep["iterations"], rep["first_loss"], rep["final_loss"]) == (6, 5.0, 2.5)
    gens = [(g["generation"], g["first_iter"], g["last_iter"], g["devices"], g["samples_per_s"])
            for g in rep["generations"]]  # fmt: skip
    assert gens == [(0, 0, 2, 8, 16.0), (1, 3, 5, 7, 32.0)]
    assert rep["event_counts"] == {
        "fail-slow": 1,
        "fail-stop": 1,
        "inject-slow": 1,
        "inject-stop": 1,
        "replan": 1,
    }
    assert rep["recoveries"][0]["kill_to_commit_s"] == 0.6 and rep["recovery_s"] == 0.6
    what = {e["kind"]: e["what"] for e in rep["events"]}
    assert what["fail-stop"].startswith("device [5] died (exit); recovered in 0.60 s (detect 0.05")
    assert what["replan"] == "generation 1 on 7 devices (resihp: exclude): r1s0 [4] L0-1 heads [8]"
    assert what["inject-slow"] == "injected slow of [2] at 0.4x"
    assert rep["final_generation"] == 1 and rep["final_layout"].split("; ")[2] == "r1s0 [4] L0-1 heads [8]"


def test_report_prints_writes_json_and_plots(run_file, tmp_path, capsys):
    out, png = tmp_path / "rep.json", tmp_path / "rep.png"
    assert main(["report", run_file, "--json", str(out), "--plot", str(png)]) == 0
    text = capsys.readouterr().out
    assert "time lost to fail-stop recoveries: 0.60 s over 1" in text
    assert "final layout (generation 1): r0s0 [0, 1] L0-1 heads [4, 4];" in text
    assert json.loads(out.read_text())["generations"][1]["samples_per_s"] == 32.0
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 20_000


def test_a_failed_run_without_iterations_still_reports(tmp_path, capsys):
    """A run that failed before its first commit has events but no rows: reported, not an error."""
    path = tmp_path / "failed.json"
    path.write_text(
        json.dumps({"iterations": [], "events": [{"iter": 0, "kind": "fail-stop", "devices": [1]}]})
    )
    assert main(["report", str(path), "--plot", str(tmp_path / "f.png")]) == 0
    assert "no committed iteration" in capsys.readouterr().out


@pytest.mark.parametrize(
    "body, message",
    [
        ([1, 2], "no 'iterations' list"),
        (
            {"iterations": [{"iter": 0}], "events": []},
            r"iterations\[0\].loss = None: missing or not a number",
        ),
        ({"iterations": [], "events": [{"iter": "3", "kind": "x"}]}, "events\\[0\\].iter = '3'"),
    ],
)
def test_bad_run_files_are_one_line_errors(tmp_path, body, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(body))
    with pytest.raises(ValueError, match=message):
        load_run(str(path))
