"""`resihp train` configuration: TOML loading, validation, and plans that cannot run (no processes)."""

import pytest

from resihp.core.model_spec import model_preset
from resihp.core.plan import Plan
from resihp.runtime.config import TrainConfig
from resihp.runtime.train import run_training


def test_default_config_is_the_embedded_job():
    """The default is tiny LLaMA, tp 2 / pp 2 / dp 2 on 8 workers, on the embedded corpus."""
    cfg = TrainConfig()
    plan = cfg.plan()
    assert (cfg.tp, cfg.pp, cfg.dp, cfg.workers, cfg.lengths) == (2, 2, 2, 8, "pystdlib")
    assert len(plan.devices()) == 8 and plan.model == model_preset("tiny")


def test_toml_round_trip_and_unknown_keys(tmp_path):
    """Sections map to fields; an unknown section or key is named in the error with what is allowed."""
    path = tmp_path / "job.toml"
    path.write_text(
        '[model]\npreset = "tiny-gqa"\n[parallel]\ntp = 3\npp = 3\ndp = 1\nschedule = "zbh1"\n'
        "[run]\niterations = 5\nworkers = 9\ntiming = false\n[optim]\nlr = 0.01\n"
    )
    cfg = TrainConfig.from_toml(str(path))
    assert (cfg.model, cfg.tp, cfg.pp, cfg.schedule, cfg.iterations, cfg.timing, cfg.lr) == (
        "tiny-gqa",
        3,
        3,
        "zbh1",
        5,
        False,
        0.01,
    )
    with pytest.raises(ValueError, match=r"unknown key parallel\.tpp; allowed: tp, pp"):
        TrainConfig.from_dict({"parallel": {"tpp": 2}})
    with pytest.raises(ValueError, match=r"unknown section \[modle\]"):
        TrainConfig.from_dict({"modle": {}})
    path.write_text("[run\n")
    with pytest.raises(ValueError, match="not valid TOML"):
        TrainConfig.from_toml(str(path))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"parallel": {"schedule": "pipedream"}},
            r"parallel\.schedule = 'pipedream': allowed: gpipe, 1f1b, zbh1",
        ),
        ({"parallel": {"tp": 0}}, r"parallel\.tp = 0: must be a positive integer"),
        ({"parallel": {"p2p": "ring"}}, r"parallel\.p2p = 'ring': allowed: root, chunked"),
        ({"run": {"workers": "8"}}, r"run\.workers = '8'"),
        ({"model": {"preset": "gpt5"}}, r"model\.preset = 'gpt5': unknown"),
        ({"optim": {"lr": -1.0}}, r"optim\.lr = -1\.0"),
        ({"workload": {"lengths": "books"}}, r"workload\.lengths = 'books'"),
        ({"run": {"link_mb_per_s": -1}}, r"run\.link_mb_per_s = -1: must be a number >= 0"),
        ({"run": {"devices_per_node": 0}}, r"run\.devices_per_node = 0: must be a positive integer"),
    ],
)
def test_bad_values_name_the_key(changes, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig.from_dict(changes)


def test_plans_that_do_not_fit_fail_before_any_process_starts(monkeypatch):
    """More TP ranks than heads, more stages than layers, more devices than workers: one ValueError."""
    import resihp.runtime.train as train

    def no_launch(*args, **kwargs):
        raise AssertionError("a process was started")

    monkeypatch.setattr(train, "launch_elastic", no_launch)
    with pytest.raises(ValueError, match=r"parallel\.tp = 9: more than the model's 8 heads"):
        run_training(TrainConfig(tp=9, pp=1, dp=1, workers=9), progress=False)
    with pytest.raises(ValueError, match=r"parallel\.pp = 5: more stages than the model's 4 layers"):
        run_training(TrainConfig(tp=1, pp=5, dp=1), progress=False)
    with pytest.raises(ValueError, match=r"the plan needs 8 devices but run\.workers = 4"):
        run_training(TrainConfig(workers=4), progress=False)
    plan = Plan.uniform(model_preset("tiny"), 2, 2, 1, 2)
    with pytest.raises(ValueError, match=r"needs 4 devices but run\.workers = 2"):
        run_training(TrainConfig(workers=2), plan, progress=False)
