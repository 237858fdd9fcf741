"""`analyse_ops` on small generated per-operation traces (ops_traces.py): the slowed device is found
with its severity and onset, a heavier stage is imbalance and never a device fault, length jitter
and long-document bursts alone report nothing, partial ranks and non-consecutive steps work."""

import subprocess
import sys

import pytest
from ops_traces import SAMPLE_META, SAMPLE_STEPS, synth_ops, write_csv, write_meta

from resihp.detect.ops_detect import OpsDetectConfig, analyse_ops
from resihp.detect.ops_meta import read_meta
from resihp.detect.ops_trace import read_ops_trace


def analyse(tmp_path, layout=None, **kw):
    layout = layout or {}
    meta = read_meta(write_meta(tmp_path / "meta.yaml", **layout))
    rows = synth_ops(**{**layout, **kw})
    return analyse_ops(read_ops_trace(write_csv(rows, tmp_path / "trace.csv"), meta))


@pytest.mark.parametrize("seed", [0, 1])
def test_slowed_rank_found_with_speed_and_first_step(tmp_path, seed):
    """Rank 5 at speed 0.41 from step 16 (its TP peer 4 dragged along): both named, right stage and
    dp_rank, speed within 10%, first_step within 1 step; nothing else reported."""
    rep = analyse(tmp_path, slow=(5, 0.41, 16), seed=seed)
    assert rep.ranks == 16 and rep.steps == 44
    assert [e["rank"] for e in rep.fail_slow] == [4, 5]
    for e in rep.fail_slow:
        assert (e["stage"], e["dp_rank"]) == (1, 0)
        assert e["speed"] == pytest.approx(0.41, rel=0.10)
        assert abs(e["first_step"] - 16) <= 1
    assert rep.stage_imbalance == []


def test_slow_device_alone_when_tp_peers_keep_their_pace(tmp_path):
    """Without the TP drag only the slowed rank is named (speed 0.7 from step 20)."""
    rep = analyse(tmp_path, slow=(9, 0.7, 20), tp_drag=False)
    assert [(e["rank"], e["stage"], e["dp_rank"]) for e in rep.fail_slow] == [(9, 2, 0)]
    assert rep.fail_slow[0]["speed"] == pytest.approx(0.7, rel=0.10)
    assert abs(rep.fail_slow[0]["first_step"] - 20) <= 1


def test_slow_from_the_first_step_is_found(tmp_path):
    """No change point exists; the device is still slower than its peers, from step 0."""
    rep = analyse(tmp_path, slow=(3, 0.6, 0), tp_drag=False)
    assert [(e["rank"], e["first_step"]) for e in rep.fail_slow] == [(3, 0)]
    assert rep.fail_slow[0]["speed"] == pytest.approx(0.6, rel=0.10)


def test_recovered_device_speed_is_that_of_its_slow_episode(tmp_path):
    """Slow at 0.5 for steps 16-29 only: the episode's speed is 0.5, not diluted by the healthy rest."""
    rep = analyse(tmp_path, slow=(5, 0.5, 16, 30), tp_drag=False)
    assert [(e["rank"], e["first_step"]) for e in rep.fail_slow] == [(5, 16)]
    assert rep.fail_slow[0]["speed"] == pytest.approx(0.5, rel=0.10)


@pytest.mark.parametrize("slow, first", [((5, 0.5, 5), 5), ((5, 0.5, 20, 23), 20), ((5, 0.5, 38), 38)])
def test_early_late_and_short_episodes(tmp_path, slow, first):
    """A slowdown 5 steps into the trace (too little history for a forward change point), a
    3-step episode (too short for the forward pass to see its end), one 6 steps before the end:
    each found at its first step with the episode's speed."""
    rep = analyse(tmp_path, slow=slow, tp_drag=False)
    assert [(e["rank"], e["first_step"]) for e in rep.fail_slow] == [(5, first)]
    assert rep.fail_slow[0]["speed"] == pytest.approx(0.5, rel=0.10)


def test_heavy_last_stage_is_imbalance_not_fail_slow(tmp_path):
    """The last stage computes 1.6x the others in every replica: stage_imbalance names it, ratio
    ~1.6, and no device is blamed (its peers have the same extra work)."""
    rep = analyse(tmp_path, stage_s=[0.1, 0.1, 0.1, 0.16], jitter=0.15)
    assert rep.fail_slow == []
    assert [e["stage"] for e in rep.stage_imbalance] == [3]
    assert rep.stage_imbalance[0]["ratio"] == pytest.approx(1.6, rel=0.05)


def test_stage_imbalance_needs_more_than_20_percent(tmp_path):
    """A stage 15% heavier is within the 20% allowance; 30% heavier is not."""
    assert analyse(tmp_path, stage_s=[0.1, 0.115, 0.1, 0.1]).stage_imbalance == []
    assert [e["stage"] for e in analyse(tmp_path, stage_s=[0.1, 0.13, 0.1, 0.1]).stage_imbalance] == [1]


def test_slow_device_on_a_heavy_stage_is_both(tmp_path):
    """A slowed device on the heavy last stage is fail-slow, and the stage is still imbalanced
    (its slow steps are left out of the imbalance)."""
    rep = analyse(tmp_path, slow=(13, 0.5, 20), stage_s=[0.1, 0.1, 0.1, 0.16], tp_drag=False)
    assert [(e["rank"], e["stage"]) for e in rep.fail_slow] == [(13, 3)]
    assert [e["stage"] for e in rep.stage_imbalance] == [3]
    assert rep.stage_imbalance[0]["ratio"] == pytest.approx(1.6, rel=0.05)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_length_jitter_and_bursts_alone_report_nothing(tmp_path, seed):
    """25% lognormal jitter per micro-batch plus bursts of long documents in one replica for 6-8
    consecutive steps (x1.6, x1.4): every stage of that replica slows alike, so nothing is reported."""
    bursts = [(0, 14, 6, 1.6), (1, 30, 8, 1.4)]
    rep = analyse(tmp_path, jitter=0.25, bursts=bursts, seed=seed)
    assert rep.fail_slow == [] and rep.stage_imbalance == []


@pytest.mark.parametrize("seed", [0, 1])
def test_noisy_ranks(tmp_path, seed):
    """10% noise of each rank's own on every operation, 20% length jitter: a healthy trace reports
    no device, and a device at 0.7 from step 20 is the only one named, within 10% and 1 step."""
    assert analyse(tmp_path, noise=0.1, jitter=0.2, seed=seed).fail_slow == []
    rep = analyse(tmp_path, noise=0.1, jitter=0.2, seed=seed, slow=(9, 0.7, 20), tp_drag=False)
    assert [e["rank"] for e in rep.fail_slow] == [9]
    assert rep.fail_slow[0]["speed"] == pytest.approx(0.7, rel=0.10)
    assert abs(rep.fail_slow[0]["first_step"] - 20) <= 1


def test_bursts_do_not_hide_a_slow_device(tmp_path):
    """The same bursts with a device slowed to 0.7 from step 22: only that device is named."""
    bursts = [(0, 14, 6, 1.6), (1, 30, 8, 1.4)]
    rep = analyse(tmp_path, jitter=0.15, bursts=bursts, slow=(9, 0.7, 22), tp_drag=False)
    assert [(e["rank"], e["first_step"]) for e in rep.fail_slow] == [(9, 22)]
    assert rep.fail_slow[0]["speed"] == pytest.approx(0.7, rel=0.10)


def test_partial_ranks_and_non_consecutive_steps(tmp_path):
    """One rank per TP group (even ranks only) and every other step recorded, DP 4: rank 9 (not in
    the trace) slowed from step 40 drags its TP peer 8, which is named; first_step within 2."""
    layout = {"dp": 4}
    rep = analyse(tmp_path, layout, slow=(9, 0.5, 40), steps=range(0, 90, 2), keep=lambda r: r % 2 == 0)
    assert rep.ranks == 16 and rep.steps == 45
    assert [(e["rank"], e["stage"], e["dp_rank"]) for e in rep.fail_slow] == [(8, 1, 0)]
    assert abs(rep.fail_slow[0]["first_step"] - 40) <= 2
    assert rep.fail_slow[0]["speed"] == pytest.approx(0.5, rel=0.10)


@pytest.mark.parametrize(
    "case, kw",
    [
        ("worker", {"slow": (1, 0.41, 0)}),  # rank 1 (not recorded) slow throughout, drags rank 0
        ("stage", {"stage_s": [0.1, 0.1, 0.1, 0.16]}),
        ("lengths", {"jitter": 0.3, "bursts": [(2, 404, 100, 1.5)]}),
    ],
)
def test_traces_shaped_like_the_public_samples(tmp_path, case, kw):
    """The public samples' shape (SAMPLE_STEPS, one rank per TP group, their meta keys) with a slow
    worker, a heavy last stage, or sequence-length imbalance: each is told apart."""
    (tmp_path / "meta.yaml").write_text(SAMPLE_META)
    meta = read_meta(str(tmp_path / "meta.yaml"))
    rows = synth_ops(dp=4, pp=4, tp=4, steps=SAMPLE_STEPS, mbs=8, keep=lambda r: r % 4 == 0, **kw)
    rep = analyse_ops(read_ops_trace(write_csv(rows, tmp_path / "t.csv"), meta))
    assert (rep.ranks, rep.steps) == (16, 44)
    slow = [(e["rank"], e["stage"], e["dp_rank"], e["first_step"]) for e in rep.fail_slow]
    assert slow == ([(0, 0, 0, 16)] if case == "worker" else [])
    assert [e["stage"] for e in rep.stage_imbalance] == ([3] if case == "stage" else [])
    if case == "worker":
        assert rep.fail_slow[0]["speed"] == pytest.approx(0.41, rel=0.10)


def test_dp1_uses_tp_peers_and_lone_ranks_are_unjudged(tmp_path):
    """DP 1: a device is compared with its TP peers; with one rank per stage nobody has a peer."""
    layout = {"dp": 1, "tp": 4}
    rep = analyse(tmp_path, layout, slow=(6, 0.6, 20), tp_drag=False)
    assert [(e["rank"], e["first_step"]) for e in rep.fail_slow] == [(6, 20)]
    lone = analyse(tmp_path, layout, slow=(4, 0.6, 20), keep=lambda r: r % 4 == 0)
    assert lone.fail_slow == [] and lone.unjudged == [0, 4, 8, 12]


def test_to_dict_has_exactly_the_issue_keys(tmp_path):
    """The JSON form is {"ranks", "steps", "fail_slow": [...], "stage_imbalance": [...]}."""
    d = analyse(tmp_path, slow=(5, 0.41, 16), stage_s=[0.1, 0.1, 0.1, 0.16]).to_dict()
    assert set(d) == {"ranks", "steps", "fail_slow", "stage_imbalance"}
    assert set(d["fail_slow"][0]) == {"rank", "stage", "dp_rank", "speed", "first_step"}
    assert set(d["stage_imbalance"][0]) == {"stage", "ratio"}


def test_config_rejects_a_nonpositive_imbalance():
    with pytest.raises(ValueError, match="ops.imbalance = 0"):
        OpsDetectConfig(imbalance=0)


def test_ops_modules_import_without_torch():
    """The --ops-trace reader and analysis load neither torch nor pyarrow (pyarrow only for .parquet)."""
    code = (
        "import sys, resihp.detect.ops_detect, resihp.detect.ops_trace, resihp.detect.ops_meta; "
        "assert 'torch' not in sys.modules and 'pyarrow' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
