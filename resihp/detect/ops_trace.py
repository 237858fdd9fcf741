"""Read a per-operation trace recorded by another training system (Megatron-style), as the input of
`resihp detect --ops-trace FILE --meta META` (the analysis is `ops_detect`).

One row per operation. Required columns: `rank`, `dp_rank`, `stage`, `step` (integers >= 0; an
integral float such as 3.0 counts), `optype` (text), `start_ts` and `duration` (seconds, finite,
duration >= 0). Optional `mb_id`, `seq_id`, `mc`, `gmc` and any other column are read past: the
analysis needs compute time per rank and step only. Of the optypes (`forward-compute`,
`backward-compute`, `forward-send`, `forward-recv`, `backward-send`, `backward-recv`,
`grads-reduce-scatter`, `params-all-gather`, `optimizer`, ...) only the `COMPUTE_OPTYPES` rows
are kept and checked; every other row, whatever its optype, is skipped unread.

Formats by file name: `.csv` (stdlib `csv`, UTF-8, a header row) and `.parquet` (pyarrow, an
optional dependency imported only here and only for a Parquet file). The trace may hold any subset
of the ranks (e.g. one per TP group) and any subset of the steps, in any order. Against the META
layout: rank < world_size, dp_rank < dp_size, stage < pp_size, and a rank keeps one
(dp_rank, stage) throughout. Every violation is a ValueError naming the file and line (CSV) or
row (Parquet, 0-based), the column, the value and what is allowed.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from dataclasses import dataclass

from resihp.core.files import check_input

from .ops_meta import OpsMeta

REQUIRED_COLUMNS = ("rank", "dp_rank", "stage", "step", "optype", "start_ts", "duration")
OPTIONAL_COLUMNS = ("mb_id", "seq_id", "mc", "gmc")
COMPUTE_OPTYPES = ("forward-compute", "backward-compute")
_INT_COLUMNS = ("rank", "dp_rank", "stage", "step")
_TRACE_SUFFIXES = (".csv", ".parquet")


@dataclass(frozen=True)
class OpsTrace:
    """The compute of a per-operation trace: where each rank sits and its compute per step."""

    placement: dict[int, tuple[int, int]]  # rank -> (dp_rank, stage)
    compute_s: dict[tuple[int, int], float]  # (rank, step) -> Σ forward + backward compute seconds
    meta: OpsMeta


def _as_int(v: object) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            try:
                v = float(v)
            except ValueError:
                return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return None


def _as_float(v: object) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _csv_rows(path: str, what: str) -> Iterator[tuple[str, dict]]:
    try:
        with open(path, encoding="utf-8-sig", newline="") as fh:
            reader = csv.DictReader(fh)
            _check_columns(reader.fieldnames or [], path, what)
            for row in reader:
                yield f"{what} {path}:{reader.line_num}", row
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{what} {path}: not UTF-8 text (byte {exc.start}); a CSV trace must be UTF-8"
        ) from None
    except csv.Error as exc:
        raise ValueError(f"{what} {path}: not valid CSV ({exc})") from None


def _parquet_rows(path: str, what: str) -> Iterator[tuple[str, dict]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(
            f"{what} {path}: reading Parquet needs pyarrow, which is not installed; "
            "install it (pip install pyarrow) or give the trace as CSV"
        ) from None
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ... for a file that is not Parquet
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"{what} {path}: not a readable Parquet file ({first})") from None
    _check_columns(table.column_names, path, what)
    cols = {name: table.column(name).to_pylist() for name in REQUIRED_COLUMNS}
    for k in range(table.num_rows):
        yield f"{what} {path} row {k}", {name: cols[name][k] for name in REQUIRED_COLUMNS}


def _check_columns(names: list[str], path: str, what: str) -> None:
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing:
        raise ValueError(
            f"{what} {path}: missing column(s) {', '.join(map(repr, missing))}; "
            f"required: {', '.join(REQUIRED_COLUMNS)}"
        )


def read_ops_trace(path: str, meta: OpsMeta, what: str = "--ops-trace") -> OpsTrace:
    """Compute seconds per (rank, step) and each rank's (dp_rank, stage), checked against `meta`."""
    check_input(path, what)
    name = path.lower()
    if not name.endswith(_TRACE_SUFFIXES):
        raise ValueError(f"{what} {path}: unknown format; the name must end in {', '.join(_TRACE_SUFFIXES)}")
    rows = _parquet_rows(path, what) if name.endswith(".parquet") else _csv_rows(path, what)
    limits = {"rank": ("world_size", meta.world_size), "dp_rank": ("dp_size", meta.dp_size),
              "stage": ("pp_size", meta.pp_size)}  # fmt: skip
    placement: dict[int, tuple[int, int]] = {}
    compute: dict[tuple[int, int], float] = {}
    for where, row in rows:
        if row["optype"] not in COMPUTE_OPTYPES:
            continue
        ints = {}
        for col in _INT_COLUMNS:
            v = _as_int(row[col])
            if v is None or v < 0:
                raise ValueError(f"{where}: column {col!r} = {row[col]!r}: must be an integer >= 0")
            if col in limits and v >= limits[col][1]:
                key, n = limits[col]
                raise ValueError(f"{where}: column {col!r} = {v}: must be < {key} = {n} (--meta)")
            ints[col] = v
        for col in ("start_ts", "duration"):
            v = _as_float(row[col])
            if v is None or (col == "duration" and v < 0):
                allowed = "a number >= 0 (seconds)" if col == "duration" else "a finite number (seconds)"
                raise ValueError(f"{where}: column {col!r} = {row[col]!r}: must be {allowed}")
            if col == "duration":
                duration = v
        rank, place = ints["rank"], (ints["dp_rank"], ints["stage"])
        if placement.setdefault(rank, place) != place:
            raise ValueError(
                f"{where}: rank {rank} at (dp_rank, stage) = {place}, earlier {placement[rank]}: "
                "a rank must keep one dp_rank and stage"
            )
        key = (rank, ints["step"])
        compute[key] = compute.get(key, 0.0) + duration
    if not compute:
        raise ValueError(f"{what} {path}: no {' or '.join(COMPUTE_OPTYPES)} rows; nothing to analyse")
    return OpsTrace(placement, compute, meta)
