"""The per-operation trace reader (`read_ops_trace`) and its META file (`read_meta`): what is kept,
what is skipped, and one ValueError line naming the file, line, column or key for every bad input."""

import importlib.util

import pytest
from ops_traces import synth_ops, write_csv, write_meta

from resihp.detect.ops_meta import OpsMeta, read_meta
from resihp.detect.ops_trace import REQUIRED_COLUMNS, read_ops_trace

META = OpsMeta(dp_size=2, pp_size=4, tp_size=2, world_size=16)
HEADER = "rank,dp_rank,stage,step,optype,start_ts,duration\n"


def csv_file(tmp_path, body, header=HEADER, name="t.csv"):
    path = tmp_path / name
    path.write_text(header + body)
    return str(path)


def test_compute_per_rank_and_step_is_forward_plus_backward(tmp_path):
    """Only forward/backward-compute rows count; sends, optimizer and unknown optypes are skipped
    even with empty fields, optional columns are read past."""
    body = (
        "0,0,0,3,forward-compute,1.0,0.25\n"
        "0,0,0,3,backward-compute,1.3,0.5\n"
        "0,0,0,3,forward-send,1.8,0.1\n"
        "0,0,0,3,optimizer,,\n"
        ",,,,made-up-op,x,y\n"
        "2,1,0,7,forward-compute,2.0,0.125\n"
    )
    tr = read_ops_trace(csv_file(tmp_path, body), META)
    assert tr.compute_s == {(0, 3): 0.75, (2, 7): 0.125}
    assert tr.placement == {0: (0, 0), 2: (1, 0)}


def test_generated_trace_round_trips(tmp_path):
    """Every rank of a generated trace, with its dp_rank and stage, and every step."""
    tr = read_ops_trace(write_csv(synth_ops(steps=range(5)), tmp_path / "t.csv"), META)
    assert sorted(tr.placement) == list(range(16))
    assert tr.placement[13] == (0, 3)  # rank = tp_rank + tp * (dp_rank + dp * stage)
    assert {t for _, t in tr.compute_s} == set(range(5))


def test_integral_floats_count_as_integers(tmp_path):
    tr = read_ops_trace(csv_file(tmp_path, "1.0,0,0,4.0,forward-compute,0,0.5\n"), META)
    assert tr.compute_s == {(1, 4): 0.5}


@pytest.mark.parametrize(
    "body, message",
    [
        ("x,0,0,1,forward-compute,0,1\n", ":2: column 'rank' = 'x': must be an integer >= 0"),
        ("0,0,0,-1,forward-compute,0,1\n", ":2: column 'step' = '-1': must be an integer >= 0"),
        ("0,0,0,1.5,forward-compute,0,1\n", "column 'step' = '1.5': must be an integer >= 0"),
        ("0,0,0,1,backward-compute,0,-2\n", "column 'duration' = '-2': must be a number >= 0"),
        ("0,0,0,1,forward-compute,nan,1\n", "column 'start_ts' = 'nan': must be a finite number"),
        ("0,0,0,1,forward-compute,0\n", ":2: column 'duration' = None: must be a number >= 0"),
        ("16,0,0,1,forward-compute,0,1\n", "column 'rank' = 16: must be < world_size = 16 (--meta)"),
        ("0,2,0,1,forward-compute,0,1\n", "column 'dp_rank' = 2: must be < dp_size = 2 (--meta)"),
        ("0,0,4,1,forward-compute,0,1\n", "column 'stage' = 4: must be < pp_size = 4 (--meta)"),
        ("0,0,0,1,forward-compute,0,1\n0,0,1,2,forward-compute,0,1\n", ":3: rank 0 at (dp_rank, stage) ="),
    ],
)
def test_bad_values_name_line_column_value_and_rule(tmp_path, body, message):
    with pytest.raises(ValueError) as exc:
        read_ops_trace(csv_file(tmp_path, body), META)
    assert message in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("missing", ["duration", "dp_rank"])
def test_missing_column_is_named_with_the_required_ones(tmp_path, missing):
    header = ",".join(c for c in REQUIRED_COLUMNS if c != missing) + "\n"
    with pytest.raises(ValueError, match=f"missing column\\(s\\) '{missing}'; required: rank, dp_rank"):
        read_ops_trace(csv_file(tmp_path, "", header=header), META)


def test_no_compute_rows_and_unknown_suffix_and_bad_bytes(tmp_path):
    with pytest.raises(ValueError, match="no forward-compute or backward-compute rows"):
        read_ops_trace(csv_file(tmp_path, "0,0,0,1,optimizer,0,1\n"), META)
    with pytest.raises(ValueError, match=r"unknown format; the name must end in \.csv, \.parquet"):
        read_ops_trace(csv_file(tmp_path, "", name="t.json"), META)
    bad = tmp_path / "b.csv"
    bad.write_bytes(b"\xff\xfe rank\n")
    with pytest.raises(ValueError, match="not UTF-8 text"):
        read_ops_trace(str(bad), META)


@pytest.mark.skipif(importlib.util.find_spec("pyarrow") is not None, reason="pyarrow is installed")
def test_parquet_without_pyarrow_says_what_to_do(tmp_path):
    path = tmp_path / "t.parquet"
    path.write_bytes(b"PAR1")
    with pytest.raises(ValueError, match="reading Parquet needs pyarrow, which is not installed"):
        read_ops_trace(str(path), META)


def test_parquet_reads_like_csv(tmp_path):
    """The same rows from Parquet and CSV give the same compute (needs pyarrow; skipped without)."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = synth_ops(steps=range(4))
    table = pa.table({k: [r[k] for r in rows] for k in ("rank", "dp_rank", "stage", "step", "optype",
                                                       "start_ts", "duration")})  # fmt: skip
    pq.write_table(table, tmp_path / "t.parquet")
    a = read_ops_trace(str(tmp_path / "t.parquet"), META)
    b = read_ops_trace(write_csv(rows, tmp_path / "t.csv"), META)
    assert a.placement == b.placement and a.compute_s == pytest.approx(b.compute_s)
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(ValueError, match="not a readable Parquet file"):
        read_ops_trace(str(tmp_path / "junk.parquet"), META)


@pytest.mark.parametrize("name", ["meta.yaml", "meta.yml", "meta.toml"])
def test_meta_formats_read_the_four_keys_and_ignore_others(tmp_path, name):
    extra = {"seq_length": 4096, "model": '"llama"'}
    assert read_meta(write_meta(tmp_path / name, dp=4, pp=2, tp=8, **extra)) == OpsMeta(4, 2, 8, 64)


def test_yaml_subset_skips_nested_values_comments_and_markers(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(
        "---\n# a comment\ndp_size: 2   # replicas\npp_size: 4\ntp_size: 2\n"
        "optimizer:\n  name: adam\n  betas: [0.9, 0.95]\nlayers:\n  - 0\n  - 1\n"
        "note: 'a # in quotes'\nworld_size: 32\n...\nignored after the end marker\n"
    )
    assert read_meta(str(path)) == OpsMeta(2, 4, 2, 32)  # world 32: context parallel 2 allowed


@pytest.mark.parametrize(
    "text, message",
    [
        ("dp_size: 2\npp_size: 4\ntp_size: 2\n", "missing key 'world_size'; required: dp_size, pp_size"),
        ("dp_size: two\npp_size: 4\ntp_size: 2\nworld_size: 16\n", "dp_size = 'two': must be an integer"),
        ("dp_size: 0\npp_size: 4\ntp_size: 2\nworld_size: 16\n", "dp_size = 0: must be an integer >= 1"),
        ('dp_size: "2"\npp_size: 4\ntp_size: 2\nworld_size: 16\n', "dp_size = '2': must be an integer >= 1"),
        ("dp_size: 2\npp_size: 4\ntp_size: 2\nworld_size: 12\n", "world_size = 12: must be a multiple of"),
        ("{dp_size: 2}\n", ":1: '{dp_size: 2}': not a top-level `key: value` line"),
    ],
)
def test_bad_meta_names_the_key_value_and_rule(tmp_path, text, message):
    path = tmp_path / "m.yaml"
    path.write_text(text)
    with pytest.raises(ValueError) as exc:
        read_meta(str(path))
    assert message in str(exc.value) and str(path) in str(exc.value) and "\n" not in str(exc.value)


def test_meta_toml_errors_and_unknown_suffix(tmp_path):
    bad = tmp_path / "m.toml"
    bad.write_text("dp_size = 2\npp_size = [\n")
    with pytest.raises(ValueError, match="not valid TOML"):
        read_meta(str(bad))
    with pytest.raises(ValueError, match=r"unknown format; the name must end in \.toml, \.yaml, \.yml"):
        read_meta(write_meta(tmp_path / "m.json"))
    with pytest.raises(ValueError, match="--meta .*nope.yaml: no such file"):
        read_meta(str(tmp_path / "nope.yaml"))
