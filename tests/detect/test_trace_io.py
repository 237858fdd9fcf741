import json

import numpy as np
import pytest

from resihp.core.model_spec import model_preset
from resihp.core.plan import Plan
from resihp.core.program import compile_plan
from resihp.detect.replay import replay, samples_from_trace
from resihp.detect.trace_io import read_trace

PLAN = Plan.uniform(model_preset("tiny"), 1, 2, 1, 4, "1f1b")


def _records(iters=80, slow_from=50, slow_device=1, p=0.5, seed=0, new_plan_at=None):
    """A runtime-style trace: device 1 computes at speed p from `slow_from` on; from `new_plan_at`
    on, generation 1 runs every chunk 1.5× longer (a smaller plan)."""
    rng = np.random.default_rng(seed)
    program = compile_plan(PLAN)
    base = {"F": 0.010, "B": 0.020, "W": 0.0}
    out = []
    for it in range(iters):
        gen = int(new_plan_at is not None and it >= new_plan_at)
        speed = {d: (p if d == slow_device and it >= slow_from else 1.0) / (1 + 0.5 * gen) for d in (0, 1)}
        wall = (4 / min(speed.values()) + 1) * 0.030 * np.exp(0.01 * rng.standard_normal())
        for d in (0, 1):
            instrs = []
            for ins in program.instructions(d):
                c = base.get(ins.op, 1e-4) / speed[d] * np.exp(0.01 * rng.standard_normal())
                instrs.append([ins.op, ins.src, ins.mb, round(c, 7), 0.001])
            out.append({"iter": it, "generation": gen, "device": d, "replica": 0, "stage": d, "tp_rank": 0,
                        "wall_s": wall, "compute_s": 0.1, "comm_s": 0.01, "instrs": instrs})  # fmt: skip
    return out


def _write(path, records, tail=""):
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    return str(path)


def test_replayed_trace_finds_and_blames_the_slow_device(tmp_path):
    """A trace whose device 1 halves its speed at iteration 50 is alarmed within 3 iterations and
    device 1 is blamed at speed ≈ 0.5."""
    records = read_trace(_write(tmp_path / "t.jsonl", _records()))
    samples, plans = samples_from_trace(records, "1f1b")
    out = replay(samples, plans, lambda t, n: (np.ones(n), np.zeros(n)))
    res = out["detectors"]["resihp"]
    assert [a["iteration"] for a in res["alarms"] if a["iteration"] < 49] == []
    assert 50 <= res["alarms"][0]["detected_at"] <= 53
    top = res["reports"][0]
    assert top["kind"] == "fail-slow" and top["devices"] == [1]
    assert top["severity"] == pytest.approx(0.5, abs=0.05)


def test_plan_change_refits_and_restarts_the_series(tmp_path):
    """A new Plan generation with a slower level refits the MTP and raises no alarm of its own."""
    records = read_trace(_write(tmp_path / "t.jsonl", _records(iters=90, slow_from=10**6, new_plan_at=50)))
    samples, plans = samples_from_trace(records, "1f1b")
    out = replay(samples, plans, lambda t, n: (np.ones(n), np.zeros(n)))
    assert sorted(plans) == [0, 1]
    assert all(r["alarms"] == [] for r in out["detectors"].values())


def test_malformed_line_is_named(tmp_path):
    """A line that is not JSON raises an error naming the file and its line number."""
    lines = [json.dumps(r) for r in _records(iters=3)]
    lines[3] = lines[3][:-5] + "]]]"
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:4: malformed JSON"):
        read_trace(str(path))


def test_truncated_last_line_is_named(tmp_path):
    """A trace cut off in the middle of its last record names that line as truncated."""
    recs = _records(iters=2)
    path = _write(tmp_path / "t.jsonl", recs[:-1], tail=json.dumps(recs[-1])[:40])
    with pytest.raises(ValueError, match=r"t\.jsonl:4: truncated record"):
        read_trace(path)


@pytest.mark.parametrize(
    "change,match",
    [(lambda r: r.pop("wall_s"), "line|:2: missing field 'wall_s'"),
     (lambda r: r.update(device="x"), ":2: field 'device'"),
     (lambda r: r["instrs"].append(["NOP", 0, 0, 0.1, 0.0]), r":2: instrs\[")],
)  # fmt: skip
def test_bad_fields_are_named(tmp_path, change, match):
    """A missing or mistyped field raises an error naming the line and the field."""
    recs = _records(iters=1)
    change(recs[1])
    with pytest.raises(ValueError, match=match.split("|")[-1]):
        read_trace(_write(tmp_path / "t.jsonl", recs))


def test_unknown_fields_warn_once_and_order_is_checked(tmp_path):
    """Unknown fields are ignored with one warning; an iteration going backwards is an error."""
    recs = _records(iters=3)
    for r in recs:
        r["gpu_temp_c"] = 71
    warnings = []
    assert len(read_trace(_write(tmp_path / "t.jsonl", recs), warn=warnings.append)) == 6
    assert len(warnings) == 1 and "gpu_temp_c" in warnings[0] and "t.jsonl:1" in warnings[0]
    with pytest.raises(ValueError, match=r":3: iteration 0 after 1"):
        read_trace(_write(tmp_path / "o.jsonl", [recs[2], recs[3], recs[0]]))


def test_always_on_localization_reports_without_an_alarm(tmp_path):
    """With `watch`, a device below the factor for 3 iterations in a row is reported once, not before."""
    records = read_trace(_write(tmp_path / "t.jsonl", _records()))
    samples, plans = samples_from_trace(records, "1f1b")
    out = replay(samples, plans, lambda t, n: (np.ones(n), np.zeros(n)), watch=(0.7, 3))
    assert [(r["devices"], r["iter"]) for r in out["localizer_alarms"]] == [([1], 52)]
