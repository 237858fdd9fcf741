"""Faults files for the runtime: parsing, validation before any process starts, per-iteration state."""

import pytest

from resihp.core.faults import FaultSpec
from resihp.runtime.config import TrainConfig
from resihp.runtime.faults import faults_at, load_faults, validate_faults
from resihp.runtime.train import run_training


def _write(tmp_path, text: str) -> str:
    path = tmp_path / "faults.toml"
    path.write_text(text)
    return str(path)


def test_load_and_query_faults(tmp_path):
    """A file's faults are applied from their iteration on; stop only at its iteration; links both ways."""
    path = _write(
        tmp_path,
        "[[faults]]\nkind='slow'\ndevice=1\nat_iter=2\nseverity=0.25\n"
        "[[faults]]\nkind='link'\nsrc=0\ndst=3\nat_iter=1\nseverity=0.5\n"
        "[[faults]]\nkind='stop'\ndevice=2\nat_iter=4\n",
    )
    faults = validate_faults(load_faults(path), range(4))
    assert [f.at_iter for f in faults] == [1, 2, 4]
    assert faults_at(faults, 1, 1) == (None, 1.0, {})
    assert faults_at(faults, 1, 5) == (None, 0.25, {})
    assert faults_at(faults, 3, 1) == (None, 1.0, {0: 0.5})
    assert faults_at(faults, 0, 9) == (None, 1.0, {3: 0.5})
    assert faults_at(faults, 2, 4)[0].kind == "stop" and faults_at(faults, 2, 5)[0] is None
    back = validate_faults([*faults, FaultSpec("rejoin", at_iter=6, device=2)], range(4))
    assert back[-1].kind == "rejoin" and faults_at(back, 2, 6) == (None, 1.0, {})


@pytest.mark.parametrize(
    "faults, message",
    [
        ([FaultSpec("stop", at_iter=1, device=9)], "device 9, which is not in the plan"),
        ([FaultSpec("link", at_iter=1, src=0, dst=8, severity=0.5)], "device 8"),
        (
            [FaultSpec("stop", at_iter=1, device=1), FaultSpec("slow", at_iter=1, device=1, severity=0.5)],
            "contradictory faults",
        ),
        (
            [FaultSpec("stop", at_iter=1, device=1), FaultSpec("slow", at_iter=3, device=1, severity=0.5)],
            "stopped",
        ),
        ([FaultSpec("rejoin", at_iter=1, device=1)], "device 1 at_iter 1: the device is live"),
        ([FaultSpec("stop", at_iter=2, device=1), FaultSpec("rejoin", at_iter=2, device=1)], "is live"),
        ([FaultSpec("stop", at_s=1.0, device=1)], "at_iter"),
    ],
)
def test_bad_faults_are_rejected(faults, message):
    with pytest.raises(ValueError, match=message):
        validate_faults(faults, range(4))


def test_run_training_rejects_a_bad_faults_file_before_starting(tmp_path):
    """A fault naming a device outside the plan fails in run_training before any process starts."""
    path = _write(tmp_path, "[[faults]]\nkind='stop'\ndevice=12\nat_iter=1\n")
    with pytest.raises(ValueError, match="device 12"):
        run_training(TrainConfig(seq_len=32, iterations=2, faults=path), progress=False)
    with pytest.raises(ValueError, match="unknown key"):
        run_training(TrainConfig(faults=_write(tmp_path, "[other]\nx=1\n")), progress=False)
    with pytest.raises(ValueError, match="run.faults"):
        TrainConfig(faults=3)
