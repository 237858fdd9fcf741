"""User-named files checked before anything runs: one line naming the option, path and problem."""

import os

import pytest

from resihp.core.files import check_dir, check_input, check_output, check_outputs, read_toml, write_atomic


def test_inputs_must_be_readable_files_of_utf8_toml(tmp_path):
    good = tmp_path / "a.toml"
    good.write_text("[run]\niterations = 3\n")
    assert read_toml(str(good), "--config") == {"run": {"iterations": 3}}
    with pytest.raises(ValueError, match=f"--config {tmp_path}/nope.toml: no such file"):
        check_input(str(tmp_path / "nope.toml"), "--config")
    with pytest.raises(ValueError, match=f"scenario {tmp_path}: is a directory"):
        read_toml(str(tmp_path), "scenario")
    (tmp_path / "bin.toml").write_bytes(b"name = 'x'\n\xff")
    with pytest.raises(ValueError, match=r"bin.toml: not UTF-8 text \(byte 11\)"):
        read_toml(str(tmp_path / "bin.toml"), "--config")
    (tmp_path / "bad.toml").write_text("[run\n")
    with pytest.raises(ValueError, match=r"run.faults .*bad.toml: not valid TOML: .*line 1"):
        read_toml(str(tmp_path / "bad.toml"), "run.faults")


def test_outputs_need_an_existing_directory_that_takes_files(tmp_path, monkeypatch):
    check_output(str(tmp_path / "out.json"), "--json")
    assert os.listdir(tmp_path) == []  # the probe leaves nothing behind
    with pytest.raises(
        ValueError, match=f"--json {tmp_path}/x/out.json: directory {tmp_path}/x does not exist"
    ):
        check_output(str(tmp_path / "x" / "out.json"), "--json")
    with pytest.raises(ValueError, match=f"--plot {tmp_path}: is a directory"):
        check_output(str(tmp_path), "--plot")
    with pytest.raises(ValueError, match="--trace /proc/t.jsonl: cannot write there"):
        check_output("/proc/t.jsonl", "--trace")  # refused even to root
    check_outputs({"--json": "-", "--plot": None}, stdout=("--json",))
    monkeypatch.chdir("/proc")
    with pytest.raises(ValueError, match="--json -: cannot write there"):
        check_outputs({"--json": "-"})  # '-' is a file name where stdout is not allowed


def test_job_directories_exist_or_can_be_created(tmp_path):
    check_dir(str(tmp_path), "--checkpoint-dir")
    check_dir(str(tmp_path / "a" / "b"), "--checkpoint-dir")
    assert not (tmp_path / "a").exists()  # checked, not created
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match=f"--checkpoint-dir {tmp_path}/f: is a file, not a directory"):
        check_dir(str(tmp_path / "f"), "--checkpoint-dir")
    with pytest.raises(ValueError, match=f"run.checkpoint_dir {tmp_path}/f/ck: {tmp_path}/f is a file"):
        check_dir(str(tmp_path / "f" / "ck"), "run.checkpoint_dir")
    with pytest.raises(ValueError, match="cannot write in /proc"):
        check_dir("/proc/ck", "--checkpoint-dir")


def test_write_atomic_replaces_the_file_whole(tmp_path):
    path = tmp_path / "r.json"
    path.write_text("old")
    write_atomic(str(path), "new\n")
    assert path.read_text() == "new\n" and os.listdir(tmp_path) == ["r.json"]
    write_atomic(str(path), b"\x1f\x8b bytes")  # (bytes as they are: a gzipped recording)
    assert path.read_bytes() == b"\x1f\x8b bytes" and os.listdir(tmp_path) == ["r.json"]
