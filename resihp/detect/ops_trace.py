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
assert REQUIRED_COLUMNS == (*_INT_COLUMNS, "optype", "start_ts", "duration")  # read_ops_trace unpacks so
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


def _csv_rows(path: str, what: str) -> Iterator[tuple[int, tuple]]:
    """(line number, the REQUIRED_COLUMNS values as text) per data row; a short row's missing
    values are None, blank lines are skipped."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as fh:
            reader = csv.reader(fh)
            header = next(reader, [])
            _check_columns(header, path, what)
            at = [header.index(c) for c in REQUIRED_COLUMNS]
            width = max(at) + 1
            for row in reader:
                if not row:
                    continue
                if len(row) < width:
                    row = row + [None] * (width - len(row))
                yield reader.line_num, tuple(row[k] for k in at)
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{what} {path}: not UTF-8 text (byte {exc.start}); a CSV trace must be UTF-8"
        ) from None
    except csv.Error as exc:
        raise ValueError(f"{what} {path}: not valid CSV ({exc})") from None


def _parquet_rows(path: str, what: str) -> Iterator[tuple[int, tuple]]:
    """(row number from 0, the REQUIRED_COLUMNS values) per row; only those columns are read."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(
            f"{what} {path}: reading Parquet needs pyarrow, which is not installed; "
            "install it (the `parquet` extra: pip install pyarrow) or give the trace as CSV"
        ) from None
    try:
        names = pq.read_schema(path).names
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ... for a file that is not Parquet
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"{what} {path}: not a readable Parquet file ({first})") from None
    _check_columns(names, path, what)
    table = pq.read_table(path, columns=list(REQUIRED_COLUMNS))
    cols = [table.column(name).to_pylist() for name in REQUIRED_COLUMNS]
    yield from enumerate(zip(*cols))


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
    parquet = name.endswith(".parquet")
    rows = _parquet_rows(path, what) if parquet else _csv_rows(path, what)
    where = (lambda n: f"{what} {path} row {n}") if parquet else (lambda n: f"{what} {path}:{n}")
    limits = (meta.world_size, meta.dp_size, meta.pp_size, None)  # rank, dp_rank, stage, step
    limit_keys = ("world_size", "dp_size", "pp_size", None)
    placement: dict[int, tuple[int, int]] = {}
    compute: dict[tuple[int, int], float] = {}
    for n, (*raw_ints, optype, start_ts, duration) in rows:
        if optype not in COMPUTE_OPTYPES:
            continue
        ints = []
        for col, v, lim, key in zip(_INT_COLUMNS, raw_ints, limits, limit_keys):
            k = _as_int(v)
            if k is None or k < 0:
                raise ValueError(f"{where(n)}: column {col!r} = {v!r}: must be an integer >= 0")
            if lim is not None and k >= lim:
                raise ValueError(f"{where(n)}: column {col!r} = {k}: must be < {key} = {lim} (--meta)")
            ints.append(k)
        if _as_float(start_ts) is None:
            raise ValueError(
                f"{where(n)}: column 'start_ts' = {start_ts!r}: must be a finite number (seconds)"
            )
        seconds = _as_float(duration)
        if seconds is None or seconds < 0:
            raise ValueError(f"{where(n)}: column 'duration' = {duration!r}: must be a number >= 0 (seconds)")
        rank, dp_rank, stage, step = ints
        if placement.setdefault(rank, (dp_rank, stage)) != (dp_rank, stage):
            raise ValueError(
                f"{where(n)}: rank {rank} at (dp_rank, stage) = {(dp_rank, stage)}, earlier "
                f"{placement[rank]}: a rank must keep one dp_rank and stage"
            )
        compute[(rank, step)] = compute.get((rank, step), 0.0) + seconds
    if not compute:
        raise ValueError(f"{what} {path}: no {' or '.join(COMPUTE_OPTYPES)} rows; nothing to analyse")
    return OpsTrace(placement, compute, meta)
