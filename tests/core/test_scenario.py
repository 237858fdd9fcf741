"""The scenario TOML loader rejects bad input with one precise message."""

import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resihp.core.scenario import loads_scenario, parse_scenario

GOOD = """
name = "t"
[model]
preset = "llama2-13b"
[cluster]
nodes = 4
gpus_per_node = 8
gpu = "a100-80g"
[parallel]
tp = 4
dp = 2
pp = 4
schedule = "1f1b"
microbatches = 8
seq_len = 16384
[workload]
lengths = "github"
seed = 0
[run]
duration_s = 14400
[[faults]]
kind = "slow"
at_s = 600
device = 5
severity = 0.45
duration_s = 3600
"""


def test_good_scenario_loads():
    """The architecture §5.1 example loads into a job with its fault."""
    s = loads_scenario(GOOD)
    assert s.job.cluster.num_devices == 32 and s.job.tp == 4 and s.faults[0].device == 5
    assert s.job.initial_plan().replicas[1][3].devices == (28, 29, 30, 31)


@pytest.mark.parametrize(
    "old, new, message",
    [
        ('preset = "llama2-13b"', 'preset = "llama9"', "model.preset = 'llama9'"),
        ("seq_len = 16384", "seq_len = 16384\nbatch = 3", "parallel.batch: unknown key"),
        ("tp = 4", "tp = 8", "tp\\*pp\\*dp = 8\\*4\\*2 = 64"),
        ("pp = 4", "pp = 64", "tp\\*pp\\*dp"),
        ('schedule = "1f1b"', 'schedule = "1f2b"', "parallel.schedule = '1f2b'"),
        ("device = 5", "device = 32", "faults\\[0\\].device = 32: no such device"),
        ("severity = 0.45", "severity = 1.5", "faults.severity = 1.5"),
        ('kind = "slow"', 'kind = "melt"', "faults.kind = 'melt'"),
        ('gpu = "a100-80g"', 'gpu = "tpu"', "cluster.gpu = 'tpu'"),
        ('lengths = "github"', 'lengths = "pile9"', "workload.lengths = 'pile9'"),
        ("duration_s = 14400", "duration_s = -1", "run.duration_s = -1"),
        ("nodes = 4", 'nodes = "four"', "cluster.nodes = 'four': must be int"),
    ],
)
def test_bad_values_name_key_value_and_allowed(old, new, message):
    """Each corruption raises ValueError naming the key and value."""
    assert old in GOOD
    with pytest.raises(ValueError, match=message):
        loads_scenario(GOOD.replace(old, new, 1))


def test_more_stages_than_layers():
    """A pipeline deeper than the model is rejected before anything runs."""
    text = GOOD.replace('preset = "llama2-13b"', "layers = 2\nhidden = 64\nheads = 4\nffn = 128\nvocab = 256")
    with pytest.raises(ValueError, match="parallel.pp = 4: more stages than the model's 2 layers"):
        loads_scenario(text)


_VALUES = st.one_of(
    st.integers(-5, 10**6), st.floats(allow_nan=True), st.text(max_size=8), st.booleans(),
    st.lists(st.integers(), max_size=2),
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_corrupted_scenarios_raise_only_value_errors(data):
    """Any single corrupted value gives a valid scenario or a ValueError, never another exception."""
    raw = tomllib.loads(GOOD)
    section = data.draw(st.sampled_from(["model", "cluster", "parallel", "workload", "run", "faults"]))
    table = raw[section][0] if section == "faults" else raw[section]
    key = data.draw(st.sampled_from(sorted(table) + ["bogus"]))
    table[key] = data.draw(_VALUES)
    try:
        parse_scenario(raw)
    except ValueError as exc:
        assert str(exc)
