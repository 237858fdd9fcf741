"""The train config's `[policy]` and `run.detect_slow`, and what the controller's policy plans for
(no processes)."""

import pytest

from resihp.core.model_spec import ModelSpec
from resihp.core.plan import Plan
from resihp.cost import hardware_preset
from resihp.runtime.adapt.reconfig import live_view, planning_context
from resihp.runtime.config import TrainConfig
from resihp.sched import ResiHP, ResiHPPaper

SPEC = ModelSpec("t", 4, 32, 8, 2, 48, 256)


def test_policy_section_names_a_policy_and_its_options(tmp_path):
    """`[policy] name` plus options builds that policy with them; the default is resihp with its
    defaults, and fail-slow detection on."""
    cfg = TrainConfig()
    assert (cfg.policy, cfg.policy_options, cfg.detect_slow) == ("resihp", {}, True)
    assert isinstance(cfg.build_policy(), ResiHP) and cfg.build_policy().horizon_s == ResiHP().horizon_s
    path = tmp_path / "job.toml"
    path.write_text('[run]\ndetect_slow = false\n[policy]\nname = "resihp"\nhorizon_s = 600\ndag_top = 2\n')
    cfg = TrainConfig.from_toml(str(path))
    policy = cfg.build_policy()
    assert not cfg.detect_slow and (policy.horizon_s, policy.dag_top) == (600, 2)
    assert cfg.to_dict()["policy_options"] == {"horizon_s": 600, "dag_top": 2}
    paper = TrainConfig.from_dict({"policy": {"name": "resihp-paper", "delta": 2}}).build_policy()
    assert isinstance(paper, ResiHPPaper) and paper.delta == 2


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ({"name": "malleus"}, r"policy\.name = 'malleus': unknown policy; allowed: none, checkpoint-restart"),
        (
            {"name": "resihp", "horizon": 600},
            r"policy\.horizon: unknown option of policy 'resihp'; allowed: ",
        ),
        ({"horizon_s": "long"}, r"policy\.horizon_s = 'long': must be of type float"),
        ({"name": 3}, r"policy\.name = 3: unknown policy"),
    ],
)
def test_bad_policy_sections_name_the_key(policy, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig.from_dict({"policy": policy})


def test_detect_slow_must_be_a_bool():
    with pytest.raises(ValueError, match=r"run\.detect_slow = 'no': must be true or false"):
        TrainConfig.from_dict({"run": {"detect_slow": "no"}})


def test_cli_rejects_a_bad_policy_before_any_process(tmp_path, capsys):
    """`resihp train --config` with an unknown option: one line naming the key, exit 2."""
    from resihp.cli.main import main

    path = tmp_path / "job.toml"
    path.write_text('[policy]\nname = "resihp"\nhorizon = 600\n')
    assert main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "policy.horizon: unknown option" in err[0]


def test_run_training_hands_the_configs_policy_and_detection_to_the_controller(monkeypatch):
    """The controller gets the `[policy]` policy (or the override: None for the rules) and
    `run.detect_slow`."""
    import resihp.runtime.train as train

    seen = {}

    def no_launch(plan, job, **kw):
        seen.update(kw)
        raise RuntimeError("stop here")

    monkeypatch.setattr(train, "launch_elastic", no_launch)
    cfg = TrainConfig.from_dict(
        {"run": {"detect_slow": False}, "policy": {"name": "resihp-paper", "delta": 3}}
    )
    with pytest.raises(RuntimeError, match="stop here"):
        train.run_training(cfg, progress=False)
    assert isinstance(seen["policy"], ResiHPPaper) and seen["policy"].delta == 3 and not seen["detect_slow"]
    with pytest.raises(RuntimeError, match="stop here"):
        train.run_training(TrainConfig(), progress=False, policy=None)
    assert seen["policy"] is None and seen["detect_slow"]


def test_the_planning_context_is_the_runs_own():
    """Generation 0's plan is home, the workload the run's; the cluster has the run's node layout
    (`run.devices_per_node`; the last node's missing tail is dead) and the calibrated hardware,
    else the `cpu` preset. `live_view` marks the live members and the estimates."""
    plan = Plan.uniform(SPEC, 1, 2, 2, 2).with_changes(standby=())
    workload = TrainConfig(microbatches=2).workload()
    ctx = planning_context(plan, workload)
    assert ctx.home is plan and ctx.workload is workload
    assert (ctx.cluster.nodes, ctx.cluster.gpus_per_node, ctx.cluster.gpu) == (1, 4, "cpu")
    hw = hardware_preset("cpu").with_changes(p2p_bw=5e5)
    ctx = planning_context(plan, workload, devices_per_node=3, hardware=hw)
    assert (ctx.cluster.nodes, ctx.cluster.gpus_per_node, ctx.cluster.gpu) == (2, 3, hw)
    assert ctx.cluster.alive == (True, True, True, True, False, False)
    assert ctx.cluster.same_node(0, 2) and not ctx.cluster.same_node(2, 3)
    view = live_view(ctx, {0, 1, 3}, {1: 0.5}, {(0, 1): 0.25})
    assert view.alive == (True, True, False, True, False, False) and view.speed[1] == 0.5
    assert view.link_factor(0, 1) == 0.25 and view.gpu == hw
