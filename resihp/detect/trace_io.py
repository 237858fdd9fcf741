"""Read the runtime's per-iteration timing trace (docs/trace-format.md, version 1, JSON lines).

One record = one device × one iteration. The reader is strict about what the detector needs and
lenient about the rest: a line that is not valid JSON (a truncated last line included), a missing
or mistyped field, or an iteration going backwards raises `ValueError` naming the file and line;
fields it does not know are ignored with one warning for the whole file (naming the first line).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from resihp.core.trace_format import InstrRow

_INT_FIELDS = ("iter", "generation", "device", "replica", "stage", "tp_rank")
_NUM_FIELDS = ("wall_s", "compute_s", "comm_s")
KNOWN_FIELDS = frozenset((*_INT_FIELDS, *_NUM_FIELDS, "instrs"))


@dataclass(frozen=True)
class TraceRecord:
    iter: int
    generation: int
    device: int
    replica: int
    stage: int
    tp_rank: int
    wall_s: float
    compute_s: float
    comm_s: float
    instrs: tuple[InstrRow, ...]


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return (isinstance(v, int | float)) and not isinstance(v, bool) and v == v and v >= 0


def parse_record(raw: object, where: str) -> tuple[TraceRecord, list[str]]:
    """One decoded line → (record, unknown field names); ValueError names `where` and the field."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: a record must be a JSON object, got {type(raw).__name__}")
    for key in (*_INT_FIELDS, *_NUM_FIELDS, "instrs"):
        if key not in raw:
            raise ValueError(f"{where}: missing field {key!r}")
    for key in _INT_FIELDS:
        if not _is_int(raw[key]) or raw[key] < 0:
            raise ValueError(f"{where}: field {key!r} = {raw[key]!r}: must be an integer >= 0")
    for key in _NUM_FIELDS:
        if not _is_num(raw[key]):
            raise ValueError(f"{where}: field {key!r} = {raw[key]!r}: must be a number >= 0")
    if not isinstance(raw["instrs"], list):
        raise ValueError(f"{where}: field 'instrs' must be a list")
    instrs = []
    for k, e in enumerate(raw["instrs"]):
        if not isinstance(e, list):  # (a JSON row is a list)
            raise ValueError(f"{where}: instrs[{k}] = {e!r}: must be a list")
        try:
            instrs.append(InstrRow.from_json(e))
        except ValueError as exc:
            raise ValueError(f"{where}: instrs[{k}] = {exc}") from None
    rec = TraceRecord(
        *(raw[k] for k in _INT_FIELDS), *(float(raw[k]) for k in _NUM_FIELDS), tuple(instrs)
    )  # fmt: skip
    return rec, sorted(set(raw) - KNOWN_FIELDS)


def read_trace(path: str, warn: Callable[[str], None] = lambda msg: None) -> list[TraceRecord]:
    """All records of a JSON-lines trace, in file order (blank lines are skipped)."""
    try:
        fh = open(path, encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"trace file {path!r}: cannot open ({exc.strerror})") from None
    out: list[TraceRecord] = []
    unknown: tuple[int, list[str]] | None = None
    with fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as exc:
                what = "truncated record" if not line.endswith("\n") else "malformed JSON"
                raise ValueError(f"{where}: {what} ({exc.msg} at column {exc.colno})") from None
            rec, extra = parse_record(raw, where)
            if extra and unknown is None:
                unknown = (lineno, extra)
            if out and rec.iter < out[-1].iter:
                raise ValueError(
                    f"{where}: iteration {rec.iter} after {out[-1].iter}: records must be in order"
                )
            out.append(rec)
    if not out:
        raise ValueError(f"trace file {path!r}: no records")
    if unknown is not None:
        warn(f"{path}:{unknown[0]}: ignoring unknown field(s) {', '.join(unknown[1])} (reported once)")
    return out


def by_iteration(records: list[TraceRecord]) -> list[list[TraceRecord]]:
    """Records grouped per iteration, in order."""
    groups: list[list[TraceRecord]] = []
    for r in records:
        if groups and groups[-1][0].iter == r.iter:
            groups[-1].append(r)
        else:
            groups.append([r])
    return groups
