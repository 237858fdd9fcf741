"""One fault semantics: `resihp simulate` (a scenario's [[faults]]) and `resihp train --faults`
accept or reject the same fault list, with the same message.

Both sides go through their real loaders: the scenario loader that `plan` / `simulate` / `detect`
use, and `runtime.checks.check_run`, which `resihp train` runs before any process starts. The job
is the same on both sides: 8 devices, 10 iterations, a link model on (`run.link_mb_per_s` > 0).
"""

import pytest

from resihp.core.scenario import loads_scenario
from resihp.runtime.checks import check_run
from resihp.runtime.config import TrainConfig

SCENARIO = """
[model]
preset = "tiny"
[cluster]
nodes = 1
gpus_per_node = 8
gpu = "cpu"
[parallel]
tp = 2
pp = 2
dp = 2
microbatches = 4
seq_len = 128
[run]
iterations = 10
"""


def stop(at, d, key="at_iter"):
    return f"kind = 'stop'\ndevice = {d}\n{key} = {at}\n"


def rejoin(at, d, key="at_iter"):
    return f"kind = 'rejoin'\ndevice = {d}\n{key} = {at}\n"


def slow(at, d, key="at_iter", extra=""):
    return f"kind = 'slow'\ndevice = {d}\n{key} = {at}\nseverity = 0.5\n{extra}"


def link(at, a, b, key="at_iter", extra=""):
    return f"kind = 'link'\nsrc = {a}\ndst = {b}\n{key} = {at}\nseverity = 0.5\n{extra}"


CASES = {
    "stop, slow, rejoin": [stop(3, 5), slow(2, 1), rejoin(6, 5)],
    "time-keyed": [stop(1.5, 5, "at_s"), rejoin(4, 5, "at_s"), slow(0, 2, "at_s", "duration_s = 2\n")],
    "links both ways": [link(1, 0, 2), link(2, 3, 1, extra="duration_s = 1.5\n")],
    "stop ends a slow": [slow(1, 1), stop(3, 1), rejoin(5, 1), slow(7, 1)],
    "back-to-back slows in seconds": [slow(0, 1, "at_s", "duration_s = 5\n"), slow(5, 1, "at_s")],
    "stop phases": [stop(2, 1) + "phase = 'allreduce'\n", stop(4, 3) + "hang = true\n"],
    "overlapping slows": [slow(2, 1), slow(4, 1)],
    "overlapping slows in seconds": [slow(1, 1, "at_s", "duration_s = 5\n"), slow(3, 1, "at_s")],
    "an at_iter duration then a slow": [slow(1, 1, extra="duration_s = 0.5\n"), slow(8, 1)],
    "overlapping links": [link(1, 0, 1), link(3, 1, 0)],
    "stop of a dead device": [stop(2, 3), stop(4, 3)],
    "rejoin of a live device": [rejoin(2, 3)],
    "slow on a dead device": [stop(2, 3), slow(4, 3)],
    "link to a dead device": [stop(2, 3), link(4, 3, 0)],
    "two faults at one time": [stop(2, 3), slow(2, 3)],
    "stop and rejoin at one time": [stop(2, 3), rejoin(2, 3)],
    "mixed keys on a device": [stop(2, 3), rejoin(5.0, 3, "at_s")],
    "mixed keys through a link": [stop(1.0, 0, "at_s"), link(2, 1, 0)],
    "no such device": [stop(2, 8)],
    "no such link end": [link(2, 0, 9)],
    "at the run's end": [stop(10, 1)],
    "at_s = inf": [stop("inf", 1, "at_s")],
    "at_s = nan": [stop("nan", 1, "at_s")],
    "phase on a slow": [slow(2, 1) + "phase = 'join'\n"],
    "unknown key": [stop(2, 1) + "color = 'red'\n"],
    "severity out of range": [slow(2, 1).replace("0.5", "1.5")],
    "no time": ["kind = 'stop'\ndevice = 1\n"],
}
ACCEPTED = {
    "stop, slow, rejoin", "time-keyed", "links both ways", "stop ends a slow",
    "back-to-back slows in seconds", "stop phases",
}  # fmt: skip


def tables(faults: list[str]) -> str:
    return "".join(f"[[faults]]\n{f}" for f in faults)


def verdict(fn):
    try:
        fn()
    except ValueError as exc:
        return str(exc)
    return "accepted"


@pytest.mark.parametrize("name", sorted(CASES))
def test_simulate_and_train_give_the_same_verdict(name, tmp_path):
    """The same list, the same verdict and the same message, through both loaders."""
    text = tables(CASES[name])
    path = tmp_path / "faults.toml"
    path.write_text(text)
    config = TrainConfig(iterations=10, faults=str(path), link_mb_per_s=10.0)
    sim = verdict(lambda: loads_scenario(SCENARIO + text))
    train = verdict(lambda: check_run(config, config.plan()))
    assert sim == train
    assert (sim == "accepted") == (name in ACCEPTED), sim


def test_the_runtime_without_a_link_model_rejects_link_faults(tmp_path):
    """The one rule only the runtime can break: a link fault with `run.link_mb_per_s` = 0."""
    path = tmp_path / "faults.toml"
    path.write_text(tables([link(1, 0, 2)]))
    config = TrainConfig(iterations=10, faults=str(path))
    with pytest.raises(ValueError, match="set run.link_mb_per_s > 0"):
        check_run(config, config.plan())


def test_a_resumed_run_rejects_faults_before_its_start(tmp_path):
    path = tmp_path / "faults.toml"
    path.write_text(tables([stop(2, 1)]))
    config = TrainConfig(iterations=10, faults=str(path))
    with pytest.raises(
        ValueError, match=r"faults\[0\].at_iter = 2: before the resumed run's start; allowed: 4"
    ):
        check_run(config, config.plan(), start=4)
    assert len(check_run(config, config.plan(), start=2)) == 1
