"""The loss account (sim/account.py): the bound's samples = achieved + Σ lost, by cause and event."""

import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from resihp.core.scenario import load_scenario, loads_scenario
from resihp.sched.ours import ResiHP
from resihp.sched.registry import POLICIES as REGISTRY
from resihp.sim.account import CAUSES
from resihp.sim.compare import simulate_scenario
from resihp.sim.job import fault_free_samples_per_s, simulate
from resihp.sim.timing import PlanTimer

ROOT = Path(__file__).resolve().parents[2]
PAPER = ROOT / "scenarios" / "paper"
BASE = """
name = "t"
[model]
preset = "llama2-7b"
[cluster]
nodes = 2
gpus_per_node = 8
[parallel]
tp = 4
dp = 2
pp = 2
seq_len = {seq_len}
microbatches = 8
[run]
duration_s = {duration}
"""
POLICIES = (
    "resihp", "resihp-paper", "greyhound", "recycle", "oobleck+greyhound", "checkpoint-restart", "none",
)  # fmt: skip


def scenario(faults: str = "", duration: int = 7200, seq_len: int = 8192):
    return loads_scenario(BASE.format(duration=duration, seq_len=seq_len) + faults)


def fault(kind: str, at_s: float, **keys) -> str:
    body = "".join(f"{k} = {v}\n" for k, v in keys.items())
    return f'[[faults]]\nkind = "{kind}"\nat_s = {at_s}\n{body}'


def check_account(run: dict, name: str = "") -> None:
    """The identity, the sign of every term, and the per-event split adding up to the totals."""
    lost = run["lost"]
    assert set(lost) == set(CAUSES), name
    reached = run["samples_per_s"] / run["capacity_bound_samples_per_s"]
    assert reached + sum(lost.values()) == pytest.approx(1.0, abs=1e-3), name
    for cause, v in lost.items():
        floor = -run["above_bound"] if cause == "plan_quality" else 0.0
        assert v >= floor - 1e-9, (name, cause, v)
    assert run["above_bound"] >= 0.0 and lost["other"] == 0.0, name
    for cause in CAUSES:
        per_event = sum(e.get("lost", {}).get(cause, 0.0) for e in run["events"])
        initial = run["lost_initial_plan"] if cause == "plan_quality" else 0.0
        tol = 1e-6 * (len(run["events"]) + 2)
        assert per_event + initial == pytest.approx(lost[cause], abs=tol), (name, cause)


@st.composite
def random_faults(draw):
    """A few stops (some re-joining), at most one compute fail-slow and one slow link, on devices
    that never stop, so every trace is consistent."""
    devices = draw(st.permutations(range(16)))
    n_stop = draw(st.integers(0, 3))
    text = ""
    for d in devices[:n_stop]:
        t = draw(st.integers(60, 3000))
        text += fault("stop", t, device=d)
        if draw(st.booleans()):
            text += fault("rejoin", t + draw(st.integers(30, 590)), device=d)
    if draw(st.booleans()):
        end = draw(st.sampled_from(["", "duration_s = 900\n"]))
        sev = draw(st.sampled_from([0.2, 0.5, 0.8]))
        text += fault("slow", draw(st.integers(0, 3000)), device=devices[n_stop], severity=sev) + end
    if draw(st.booleans()):
        a, b = sorted(devices[n_stop + 1 : n_stop + 3])
        sev = draw(st.sampled_from([0.1, 0.5]))
        text += fault("link", draw(st.integers(0, 3000)), src=a, dst=b, severity=sev)
    return text


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    faults=random_faults(),
    names=st.lists(st.sampled_from(POLICIES), min_size=1, max_size=3, unique=True),
    seq_len=st.sampled_from([8192, 32768]),
    seed=st.integers(0, 3),
)
def test_account_identity_on_random_scenarios(faults, names, seq_len, seed):
    """Random small scenarios: achieved / bound + Σ lost = 1 within 1e-3, every term >= 0 (plan
    quality down to minus the share run above the bound), and the events add up to the totals."""
    out = simulate_scenario(scenario(faults, 3600, seq_len), names, seed)
    for name, run in out["policies"].items():
        check_account(run, name)


@pytest.mark.parametrize(
    "name", ["paper/table6/llama2-7b-stop-1h.toml", "paper/fig9/qwen2.5-7b-slow-M.toml",
             "paper/fig10/llama2-7b-mixed-30m.toml", "extra/node/llama2-7b-node.toml"]
)  # fmt: skip
def test_account_identity_on_paper_scenarios(name):
    """The same identity on a fast subset of the paper's scenarios (and a node loss, where the
    achieved rate runs above the bound's), for every built policy."""
    out = simulate_scenario(load_scenario(str(ROOT / "scenarios" / name)), sorted(REGISTRY), 0)
    for policy, run in out["policies"].items():
        check_account(run, f"{name} {policy}")
    if name.startswith("extra/node"):
        assert out["policies"]["resihp"]["above_bound"] > 0  # one replica with every micro-batch


def test_extra_scenarios_are_the_generators_output():
    """scenarios/extra/ holds exactly what scripts/make_extra_scenarios.py writes, and each file loads."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from make_extra_scenarios import scenarios

    written = {str(p.relative_to(ROOT / "scenarios" / "extra")): p.read_text()
               for p in (ROOT / "scenarios" / "extra").glob("*/*.toml")}  # fmt: skip
    assert written == scenarios()
    for rel in written:
        assert load_scenario(str(ROOT / "scenarios" / "extra" / rel)).faults


def _bound_samples(run) -> float:
    return run.capacity_bound_samples_per_s * 7200.0


def test_fail_stop_costs_its_hang_planning_and_pause():
    """One stop under `resihp`: the 3 s heartbeat hang is detection (charged to the stop), the
    replan's 0.1 s planning and the rest of its pause are charged to the replan."""
    s = scenario(fault("stop", 600, device=5))
    run = simulate(s, ResiHP())
    timer = PlanTimer(s.job, 0)
    x0 = fault_free_samples_per_s(s.job, timer)
    e = timer.samples_per_s(s.job.initial_plan(), s.job.cluster) / x0  # the initial plan's efficiency
    c = x0 * 15 / 16  # the bound's rate once device 5 is dead
    stop = next(ev for ev in run.events if ev["kind"] == "stop")
    replan = next(ev for ev in run.events if ev["kind"] == "replan")
    scale = 1.0 / _bound_samples(run)
    assert stop["lost"]["detection"] == pytest.approx(3.0 * c * e * scale, abs=2e-6)
    assert replan["lost"]["planning"] == pytest.approx(0.1 * c * scale, abs=2e-6)
    assert replan["lost"]["pause"] == pytest.approx((replan["pause_s"] - 0.1) * c * scale, abs=2e-6)
    assert run.account["lost"]["rework"] == 0.0 and run.account["lost"]["other"] == 0.0


def test_checkpoint_restart_pays_rework_and_restart():
    """checkpoint-restart: 10 min of hang is detection, u0 is pause, the lost work is rework."""
    run = simulate(scenario(fault("stop", 600, device=5)), REGISTRY["checkpoint-restart"]())
    replan = next(ev for ev in run.events if ev["kind"] == "replan")
    lost = replan["lost"]
    rework_s = replan["pause_s"] - 600.0
    assert rework_s > 0
    assert lost["rework"] / lost["pause"] == pytest.approx(rework_s / 600.0, rel=1e-4)
    stop = next(ev for ev in run.events if ev["kind"] == "stop")
    assert stop["lost"]["detection"] / lost["pause"] == pytest.approx(1.0, rel=1e-3)  # 600 s of hang


def test_false_alarms_are_detection():
    """Without faults, Greyhound's false-alarm pauses (3.72 s each at 32K) are detection, charged to
    each alarm, and nothing else is lost but the initial plan's distance to the bound."""
    run = simulate(scenario(seq_len=32768), REGISTRY["greyhound"]())
    alarms = [ev for ev in run.events if ev["kind"] == "false-alarm"]
    assert alarms and all(ev["lost"]["detection"] > 0 for ev in alarms)
    lost = run.account["lost"]
    assert lost["detection"] == pytest.approx(len(alarms) * 3.72 / 7200.0, rel=1e-9)
    assert lost["other"] == lost["pause"] == lost["planning"] == lost["rework"] == 0.0
    assert lost["plan_quality"] == pytest.approx(run.account["lost_initial_plan"])


def test_a_never_detected_slow_is_detection():
    """`none` never learns of a fail-slow: the whole degraded run after it is detection loss."""
    run = simulate(scenario(fault("slow", 600, device=6, severity=0.4)), REGISTRY["none"]())
    slow = next(ev for ev in run.events if ev["kind"] == "slow")
    reached = run.samples_per_s / run.capacity_bound_samples_per_s
    assert slow["lost"]["detection"] > 0.3
    initial = run.account["lost_initial_plan"]
    assert reached + slow["lost"]["detection"] + initial == pytest.approx(1.0, abs=1e-6)


def test_validation_pause_is_detection_of_the_replan():
    """A confirmed fail-slow's validation pause (0.034 s at 8K) is detection, charged to the replan."""
    s = scenario(fault("slow", 600, device=6, severity=0.4))
    run = simulate(s, ResiHP())
    replan = next(ev for ev in run.events if ev["kind"] == "replan")
    slow = next(ev for ev in run.events if ev["kind"] == "slow")
    assert replan["lost"]["detection"] > 0 and slow["lost"]["detection"] > 0
    c = fault_free_samples_per_s(s.job, PlanTimer(s.job, 0)) * (15 + 0.4) / 16
    assert replan["lost"]["detection"] == pytest.approx(0.034 * c / _bound_samples(run), abs=2e-6)
