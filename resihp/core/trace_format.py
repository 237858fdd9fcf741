"""The rows of the runtime's timing trace (docs/trace-format.md), one typed definition for all.

A trace record (one device x one iteration) is a JSON object keyed by name; its `instrs` and
`links` are lists of positional rows, which the file format keeps (version 1). In memory every
writer (`runtime/exec/worker.py`) and reader (`runtime/adapt/slowwatch.py`, `runtime/adapt/calibrate.py`,
`detect/trace_io.py`) uses the NamedTuples below, by field name: a NamedTuple *is* its JSON row
(`json.dumps` writes it as the list), and `from_json` checks a row read back.

`LossRow` is no part of the trace file: it is what a last-stage record carries to the controller
(the commit's losses), and `record_to_json` strips it. `record_from_json` is its inverse: a trace
file's object with its rows as the NamedTuples again (no check: it reads what `record_to_json`
wrote; `detect/trace_io.py` is the strict reader of files from elsewhere).

Torch-free.
"""

from __future__ import annotations

from typing import NamedTuple

OPS = ("F", "B", "W", "SEND", "RECV", "ALLREDUCE", "STEP")  # the primitives of `core.program`
COMPUTE_OPS = ("F", "B", "W")
WHATS = ("act", "grad")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_time(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and v == v and v >= 0


class InstrRow(NamedTuple):
    """One executed primitive: `compute_s` its compute-only seconds, `comm_s` those blocked in a
    collective or P2P call; `src`, `mb` its micro-batch (-1 for ALLREDUCE and STEP)."""

    op: str
    src: int
    mb: int
    compute_s: float
    comm_s: float

    @classmethod
    def from_json(cls, row) -> InstrRow:
        """The row of a JSON `instrs` entry; ValueError naming what it must be."""
        ok = (
            isinstance(row, list | tuple) and len(row) == 5 and row[0] in OPS and _is_int(row[1])
            and _is_int(row[2]) and _is_time(row[3]) and _is_time(row[4])
        )  # fmt: skip
        if not ok:
            raise ValueError(
                f"{list(row) if isinstance(row, tuple) else row!r}: must be [op, src, mb, compute_s, "
                f"comm_s] with op in {', '.join(OPS)} and times >= 0"
            )
        return cls(row[0], row[1], row[2], float(row[3]), float(row[4]))

    def to_json(self) -> list:
        return list(self)


class LinkRow(NamedTuple):
    """One P2P block `dst_device` received from `src_device`: `what` (act | grad) of micro-batch
    (`src`, `mb`), `nbytes` of payload, `transfer_s` from both ends ready to the block usable."""

    src_device: int
    dst_device: int
    what: str
    src: int
    mb: int
    nbytes: int
    transfer_s: float

    @property
    def block(self) -> tuple[int, int, str, int, int]:
        """What identifies the block across iterations: (src_device, dst_device, what, src, mb)."""
        return self[:5]

    @property
    def link(self) -> tuple[int, int]:
        return self.src_device, self.dst_device

    @classmethod
    def from_json(cls, row) -> LinkRow:
        """The row of a JSON `links` entry; ValueError naming what it must be."""
        ok = (
            isinstance(row, list | tuple) and len(row) == 7 and all(_is_int(row[k]) for k in (0, 1, 3, 4, 5))
            and row[2] in WHATS and _is_time(row[6])
        )  # fmt: skip
        if not ok:
            raise ValueError(
                f"{list(row) if isinstance(row, tuple) else row!r}: must be [src_device, dst_device, "
                f"what, src, mb, nbytes, transfer_s] with what in {', '.join(WHATS)} and transfer_s >= 0"
            )
        return cls(row[0], row[1], row[2], row[3], row[4], row[5], float(row[6]))

    def to_json(self) -> list:
        return list(self)


class LossRow(NamedTuple):
    """A micro-batch's loss on the last stage: its global index in the iteration, its summed
    cross-entropy scaled as the global batch's share (`model.loss.microbatch_loss`), its targets."""

    mb: int
    loss: float
    targets: int


def record_to_json(record: dict) -> dict:
    """A worker's record as its trace-file object: rows as JSON lists, the losses left out."""
    out = {k: v for k, v in record.items() if k != "losses"}
    out["instrs"] = [row.to_json() for row in record["instrs"]]
    out["links"] = [row.to_json() for row in record["links"]]
    return out


def record_from_json(obj: dict) -> dict:
    """A trace-file object (`record_to_json`'s, or its line through `json.loads`) as a record with
    its rows as `InstrRow` and `LinkRow` (the losses stay absent)."""
    out = dict(obj)
    out["instrs"] = [InstrRow._make(row) for row in obj["instrs"]]
    out["links"] = [LinkRow._make(row) for row in obj["links"]]
    return out
