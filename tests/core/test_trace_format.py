"""The trace's typed rows: a row is its JSON list, a JSON list reads back as the same row."""

import json

import pytest

from resihp.core.trace_format import InstrRow, LinkRow, LossRow, record_from_json, record_to_json


def test_rows_are_their_json_lists_and_read_back_equal():
    """json.dumps writes a row as the positional list of docs/trace-format.md; from_json of that list
    (integers where seconds are expected included) gives the row back, fields by name."""
    instr = InstrRow("RECV", 0, 1, 0.0000012, 0.0213)
    link = LinkRow(4, 5, "act", 0, 1, 32768, 0.0331)
    assert json.loads(json.dumps(instr)) == ["RECV", 0, 1, 0.0000012, 0.0213] == instr.to_json()
    assert json.loads(json.dumps(link)) == [4, 5, "act", 0, 1, 32768, 0.0331] == link.to_json()
    assert InstrRow.from_json(json.loads(json.dumps(instr))) == instr
    assert LinkRow.from_json(json.loads(json.dumps(link))) == link
    assert InstrRow.from_json(["STEP", -1, -1, 0, 0]) == InstrRow("STEP", -1, -1, 0.0, 0.0)
    assert link.block == (4, 5, "act", 0, 1) and link.link == (4, 5)


@pytest.mark.parametrize(
    "row",
    [["NOP", 0, 0, 0.1, 0.0], ["F", 0, 0, -0.1, 0.0], ["F", 0, 0, 0.1], ["F", 0.5, 0, 0.1, 0.0],
     ["F", True, 0, 0.1, 0.0], ["F", 0, 0, float("nan"), 0.0], "F"],
)  # fmt: skip
def test_bad_instr_rows_are_rejected_naming_the_shape(row):
    with pytest.raises(ValueError, match=r"must be \[op, src, mb, compute_s, comm_s\]"):
        InstrRow.from_json(row)


@pytest.mark.parametrize(
    "row", [[4, 5, "weights", 0, 1, 8, 0.1], [4, 5, "act", 0, 1, 8, -1.0], [4, 5, "act", 0, 1, 8.5, 0.1]]
)
def test_bad_link_rows_are_rejected_naming_the_shape(row):
    with pytest.raises(ValueError, match=r"must be \[src_device, dst_device, what"):
        LinkRow.from_json(row)


def test_a_record_goes_to_json_without_its_losses():
    rec = {"iter": 0, "device": 3, "instrs": [InstrRow("F", 0, 0, 0.1, 0.0)], "links": [],
           "losses": [LossRow(0, 1.5, 30)]}  # fmt: skip
    out = record_to_json(rec)
    assert out == {"iter": 0, "device": 3, "instrs": [["F", 0, 0, 0.1, 0.0]], "links": []}
    assert json.loads(json.dumps(out)) == out and "losses" in rec


def test_a_record_read_back_from_its_json_line_has_its_rows_by_name():
    """`record_from_json` undoes `record_to_json` through a JSON line: the same record without its
    losses, its rows NamedTuples again (the slow watch reads `row.block`, `row.transfer_s`)."""
    rec = {"iter": 2, "device": 3, "wall_s": 0.5, "instrs": [InstrRow("F", 0, 1, 0.1, 0.0)],
           "links": [LinkRow(2, 3, "act", 0, 1, 64, 0.02)], "losses": [LossRow(1, 1.5, 30)]}  # fmt: skip
    back = record_from_json(json.loads(json.dumps(record_to_json(rec))))
    assert back == {k: v for k, v in rec.items() if k != "losses"}
    assert back["links"][0].block == (2, 3, "act", 0, 1) and back["instrs"][0].compute_s == 0.1
    assert type(back["instrs"][0]) is InstrRow and type(back["links"][0]) is LinkRow
