"""The controller's trace records: streamed to the trace file as iterations settle, a window kept.

Every plan device sends its trace record of each iteration it ran (`protocol.Record`, after the
commit of that iteration), as its line of the trace file (`trace_line`: the member encodes it once,
the controller never re-encodes it). `RecordStore` is where they all go, and the only place that
holds them:

* in memory only the iterations whose records may still come (`pending`: the window, in practice
  the last one or two iterations): an iteration is *settled* once every plan device of its
  generation sent its record, or once the next iteration was committed (every live device sent
  its record of `k` before it reported `Reached` for `k + 1`; a device that died in between never
  will). `add` hands a complete iteration's lines to its caller once (the slow watch and the
  calibration decode them: `decode`);
* a settled iteration's lines go, in device order, to the trace file (`path`: JSON lines,
  docs/trace-format.md, `core.trace_format.record_to_json`), as they came, iterations in order:
  the file is the run's committed history;
* `rewind(k)` (a restart from the checkpoint at iteration `k`, or a rollback to the snapshots
  before `k`: `adapt/restart.rewind`, the one rewind point): the records
  of iterations `k` and later leave the window and the file (truncated where `k` began), so the
  history the re-run appends has no gap and no repeat.

`path` None: the records are kept nowhere once settled (no trace asked for). `TraceFile` is such a
file as a run's result carries it; `trace_chunks` writes either form as `--json`'s list. Torch-free.
"""

from __future__ import annotations

import json
import os
import tempfile

from resihp.core.trace_format import record_from_json, record_to_json


def trace_line(record: dict) -> str:
    """One record as its line of the trace file (also an element of `--json`'s `"trace"` list)."""
    return json.dumps(record_to_json(record))


def decode(line: bytes) -> dict:
    """The record of a `trace_line` (its rows as NamedTuples, its losses absent)."""
    return record_from_json(json.loads(line))


class RecordStore:
    """The run's trace records, as their lines (see the module docstring). `starts` holds one file
    offset per settled iteration (what `rewind` truncates to): the only state that grows with the
    run."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.file = None if path is None else open(path, "wb")  # noqa: SIM115 (closed by `close`)
        self.pending: dict[int, dict[int, bytes]] = {}  # iteration -> device -> its record's line
        self.starts: dict[int, int] = {}  # iteration -> where its records begin in the file

    def add(self, device: int, it: int, line: bytes, expected: int) -> list[bytes] | None:
        """File `device`'s record of iteration `it` (its `trace_line`, encoded); once `expected`
        devices sent theirs for `it`, the iteration settles and its lines (device order) are
        returned — once — else None."""
        got = self.pending.setdefault(it, {})
        got[device] = line
        if len(got) < expected:
            return None
        self.settle(it + 1)
        return [got[d] for d in sorted(got)]

    def settle(self, upto: int) -> None:
        """Iterations before `upto` settle: their records go to the file, out of the window."""
        for k in sorted(k for k in self.pending if k < upto):
            got = self.pending.pop(k)
            if self.file is not None:
                self.starts.setdefault(k, self.file.tell())
                self.file.write(b"".join(got[d] + b"\n" for d in sorted(got)))

    def rewind(self, it: int) -> None:
        """Forget the records of iterations `it` and later (they run again)."""
        for k in [k for k in self.pending if k >= it]:
            del self.pending[k]
        later = sorted(k for k in self.starts if k >= it)
        if self.file is not None and later:
            self.file.seek(self.starts[later[0]])
            self.file.truncate()
        for k in later:
            del self.starts[k]

    def close(self) -> None:
        """The run is over: whatever is left in the window settles; the file is complete."""
        self.settle(1 << 62)
        if self.file is not None:
            self.file.close()
            self.file = None


class TraceFile:
    """A run's trace on disk (what a `RecordStore` wrote to `path`), for the result to carry without
    holding it: `lines()` streams it (`--json`'s `"trace"`), `read()` loads it; a `temporary` file
    (no `run.trace` was asked for) goes with `discard()`. `fd`: the open descriptor of a file
    without a name (`nameless`), which `discard` closes."""

    def __init__(self, path: str, temporary: bool, fd: int | None = None) -> None:
        self.path, self.temporary, self.fd = path, temporary, fd

    @classmethod
    def nameless(cls) -> TraceFile:
        """A temporary trace file, unlinked as soon as it is made and reached through this process's
        descriptor (`/proc/self/fd/N`): a run that dies however it dies, SIGKILL included, leaves
        nothing in $TMPDIR (the kernel frees it with the process). Without /proc: a named
        temporary file, removed by `discard`."""
        fd, path = tempfile.mkstemp(prefix="resihp-trace-", suffix=".jsonl")
        if not os.path.isdir("/proc/self/fd"):
            os.close(fd)
            return cls(path, temporary=True)
        os.unlink(path)
        return cls(f"/proc/self/fd/{fd}", temporary=True, fd=fd)

    def lines(self):
        with open(self.path) as f:
            for line in f:
                yield line.rstrip("\n")

    def read(self) -> list[dict]:
        return [json.loads(line) for line in self.lines()]

    def discard(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        elif self.temporary and os.path.exists(self.path):
            os.unlink(self.path)


def trace_chunks(trace):
    """`trace` (a list of record objects, or a `TraceFile`) as the text of its JSON list, in pieces:
    what `json.dumps` writes for the list, without holding it whole."""
    items = trace.lines() if isinstance(trace, TraceFile) else (json.dumps(r) for r in trace)
    yield "["
    for i, item in enumerate(items):
        yield item if i == 0 else ", " + item
    yield "]"
