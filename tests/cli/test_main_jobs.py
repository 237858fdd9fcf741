"""The README's main commands run end to end (shortened where they would take minutes)."""

import json
import subprocess
import sys

import pytest


def _resihp(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "resihp.cli.main", *args], capture_output=True, text=True, timeout=timeout
    )


def test_demo_prints_every_built_policy(tmp_path):
    """`resihp demo` simulates the 256-GPU job under all ten policies and prints a row for each."""
    out = _resihp("demo", "--json", str(tmp_path / "demo.json"))
    assert out.returncode == 0, out.stderr
    result = json.loads((tmp_path / "demo.json").read_text())
    assert len(result["policies"]) == 10
    for name, run in result["policies"].items():
        assert name in out.stdout
        assert 0 <= run["samples_per_s"] <= run["capacity_bound_samples_per_s"] * 1.0001
    assert result["policies"]["none"]["aborted"]  # a fail-stop hangs an unmitigated job


@pytest.mark.slow
def test_train_cli_runs_and_writes_json(tmp_path):
    """`resihp train` (shortened) launches 8 workers, prints a loss table and writes §5.5 JSON."""
    path = tmp_path / "train.json"
    out = _resihp("train", "--iterations", "4", "--quiet", "--json", str(path))
    assert out.returncode == 0, out.stderr
    result = json.loads(path.read_text())
    assert [r["iter"] for r in result["iterations"]] == [0, 1, 2, 3]
    assert all(r["samples"] == 8 and r["generation"] == 0 for r in result["iterations"])
    assert result["iterations"][-1]["loss"] < result["iterations"][0]["loss"]
    assert "loss" in out.stdout and "Traceback" not in out.stderr


def test_train_bad_config_is_one_line(tmp_path):
    """A training config whose plan does not fit the model is one clear error before any process starts."""
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[parallel]\ntp = 16\npp = 1\ndp = 1\n[run]\nworkers = 16\n")
    out = _resihp("train", "--config", str(cfg))
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and "tp" in out.stderr
