"""The controller's trace records (`control/records.py`): streamed to the file as iterations settle,
a window in memory, the history rewound on a restart; and `--json` written with the trace
streamed from that file, the same text as the whole result through `json.dumps`."""

import json

import pytest

from resihp.cli.train_cmd import write_result
from resihp.core.trace_format import InstrRow, LinkRow, LossRow, record_to_json
from resihp.runtime.control.records import RecordStore, TraceFile, decode, trace_line


def _rec(it: int, dev: int, gen: int = 0) -> dict:
    return {
        "iter": it, "generation": gen, "device": dev, "replica": dev // 2, "stage": dev % 2, "tp_rank": 0,
        "wall_s": 0.1 + dev / 1000, "cpu_s": 0.05, "compute_s": 0.04, "comm_s": 0.01,
        "instrs": [InstrRow("F", 0, 0, 0.0041, 0.0009), InstrRow("STEP", -1, -1, 0.002, 0.0)],
        "links": [LinkRow(0, 1, "act", 0, 0, 32768, 0.0331)],
        "losses": [LossRow(0, 1.25, 31)], "allreduce_bytes": 1204, "grad_norm": None,
    }  # fmt: skip


def _add(store: RecordStore, rec: dict, expected: int) -> list[dict] | None:
    """File `rec` as a member sends it (its trace line); the settled iteration's records, decoded."""
    got = store.add(rec["device"], rec["iter"], trace_line(rec).encode(), expected)
    return None if got is None else [decode(line) for line in got]


def _lines(path) -> list[tuple[int, int]]:
    return [(r["iter"], r["device"]) for r in map(json.loads, path.read_text().splitlines())]


def test_iterations_settle_in_order_and_the_window_stays_small(tmp_path):
    """A complete iteration is handed out once, in device order, and goes to the file; one with a
    record missing (its device died) settles at the next commit; memory holds only the window."""
    path = tmp_path / "t.jsonl"
    store = RecordStore(str(path))
    assert _add(store, _rec(0, 1), 2) is None
    got = _add(store, _rec(0, 0), 2)
    assert [r["device"] for r in got] == [0, 1] and store.pending == {}
    assert got[0] == {k: v for k, v in _rec(0, 0).items() if k != "losses"}  # (rows as NamedTuples)
    assert _add(store, _rec(1, 0), 2) is None  # device 1 died after iteration 1's commit
    store.settle(2)  # iteration 2 committed: iteration 1 has every record it will get
    for it in range(2, 200):
        for dev in (1, 0):
            _add(store, _rec(it, dev), 2)
        assert sum(len(v) for v in store.pending.values()) <= 1
    store.close()
    assert _lines(path) == [(0, 0), (0, 1), (1, 0)] + [(it, d) for it in range(2, 200) for d in (0, 1)]
    assert json.loads(path.read_text().splitlines()[0]) == record_to_json(_rec(0, 0))


def test_rewind_truncates_the_history_to_the_checkpoint(tmp_path):
    """A restart from the checkpoint at iteration 2 drops iterations 2.. from the file and the
    window; the re-run appends them again: no gap, no repeat."""
    path = tmp_path / "t.jsonl"
    store = RecordStore(str(path))
    for it in range(4):
        for dev in (0, 1):
            _add(store, _rec(it, dev), 2)
    _add(store, _rec(4, 0), 2)  # in the window when the failure came
    store.rewind(2)
    assert store.pending == {}
    for it in range(2, 5):
        for dev in (0, 1):
            _add(store, _rec(it, dev, gen=1), 2)
    store.close()
    assert _lines(path) == [(it, d) for it in range(5) for d in (0, 1)]
    gens = [json.loads(x)["generation"] for x in path.read_text().splitlines()]
    assert gens == [0] * 4 + [1] * 6


def test_no_path_keeps_nothing_once_settled():
    store = RecordStore(None)
    for it in range(50):
        _add(store, _rec(it, 0), 1)
    store.close()
    assert store.pending == {} and store.starts == {}


def test_json_with_the_trace_streamed_from_its_file_is_what_json_dumps_writes(tmp_path):
    """`write_result` streams the trace (a list, or the file a run wrote) into the JSON text: the
    same bytes as `json.dumps` of the whole result, with keys in the result's order."""
    recs = [_rec(it, d) for it in range(3) for d in (0, 1)]
    path = tmp_path / "t.jsonl"
    store = RecordStore(str(path))
    for r in recs:
        _add(store, r, 2)
    store.close()
    trace = [record_to_json(r) for r in recs]
    result = {"config": {"trace": None, "name": '"\\u0000trace"'}, "status": "done", "trace_version": 1,
              "trace": trace, "plans": [{"generation": 0}], "worker_pids": [1], "state": {}}  # fmt: skip
    want = json.dumps({k: v for k, v in result.items() if k not in ("worker_pids", "state")})
    for form in (trace, TraceFile(str(path), temporary=False), []):
        out = tmp_path / "r.json"
        write_result({**result, "trace": form}, str(out))
        expect = want if form != [] else want.replace(json.dumps(trace), "[]")
        assert out.read_text() == expect
    tmp = TraceFile(str(path), temporary=True)
    assert tmp.read() == trace
    tmp.discard()
    assert not path.exists()


def test_the_temporary_trace_has_no_name_and_a_killed_run_leaves_nothing(tmp_path, monkeypatch):
    """Without `run.trace` the records stream to a file unlinked at once (`TraceFile.nameless`):
    written, rewound and read back through the process's descriptor, gone with `discard` — and a
    process SIGKILLed while holding one leaves nothing in $TMPDIR."""
    import os
    import signal
    import subprocess
    import sys
    import tempfile

    from resihp.runtime.train import trace_file

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    trace = trace_file(None, "list")
    assert trace.temporary and list(tmp_path.iterdir()) == []
    store = RecordStore(trace.path)
    for it in range(3):
        _add(store, _rec(it, 0), 1)
    store.rewind(2)
    store.close()
    assert [r["iter"] for r in trace.read()] == [0, 1]
    fd = trace.fd
    trace.discard()
    with pytest.raises(OSError):
        os.fstat(fd)  # closed
    code = (
        "import os; from resihp.runtime.control.records import TraceFile; t = TraceFile.nameless(); "
        "open(t.path, 'w').write('x' * 4096); os.kill(os.getpid(), 9)"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", code], env=env, timeout=60)
    assert run.returncode == -signal.SIGKILL and list(tmp_path.iterdir()) == []
