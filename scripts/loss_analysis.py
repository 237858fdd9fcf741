"""Evidence behind a policy's loss account: what its pauses are made of, and how far its steady
state is from the best plan we can find for the same cluster state (issue 19).

    python scripts/loss_analysis.py [--family table6 fig10 ...] [--scenarios scenarios/paper]
                                    [--out results/loss-analysis] [--policy resihp]

Per scenario, one JSON with
- `pause`: every pausing Decision's `reconfig.pause_s` split as reconfig.py composes it
  (planning, communicator rebuild, the bytes over their links (`reconfig.transfer_s`), the
  fixed cost per layer moved into a group); the split is checked to add up to pause_s, so it cannot drift from
  `reconfig_cost` unnoticed; as shares of the bound's samples and in seconds;
- `steady`: the running intervals where the policy knows the true cluster (the plan_quality part
  of the account), as shares of the bound's samples: `gap` (bound - achieved), `to_long_horizon`
  (what `resihp` with an infinite horizon, i.e. ignoring its pause, would reach instead),
  `to_reweighted` (the chosen plan with the global batch re-split over its replicas, no
  migration), `to_best_known` (the best of those and a brute-force search over regular layouts on the healthy
  live devices: every TP degree dividing a node, every PP degree, DP as the groups allow, even or
  head-aware layer split, memory checked; reconfiguration cost ignored). gap - to_best_known is
  what no plan we know takes back (negative: the bound is beaten). The best regular layout often
  beats X0 on the healthy cluster too (`best_regular_healthy`), so `to_best_known_scaled` rescales
  regular layouts' rates by X0 / that healthy rate: what a plan would gain if it kept, under the
  fault, the share of its healthy rate the best regular layout keeps.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from resihp.core.plan import Plan, even_split, split_by_weight  # noqa: E402
from resihp.core.scenario import load_scenario  # noqa: E402
from resihp.sched.context import PlanningContext  # noqa: E402
from resihp.sched.model import fits_memory, head_layers  # noqa: E402
from resihp.sched.ours import ResiHP  # noqa: E402
from resihp.sched.partition import minmax_partition  # noqa: E402
from resihp.sched.reconfig import COMM_REBUILD_S, LAYER_FIXED_S, transfer_s  # noqa: E402
from resihp.sched.registry import POLICIES  # noqa: E402
from resihp.sim import job as jobsim  # noqa: E402
from resihp.sim.account import LossAccount, unknown_changes  # noqa: E402


class Recording(LossAccount):
    """The account, also keeping its steady intervals (running, cluster known): (dt, plan, cluster, options,
    achieved rate, bound rate)."""

    epochs: list = []

    def advance(self, run, t, cut, t_end, cap_rate, x):
        super().advance(run, t, cut, t_end, cap_rate, x)
        if not run.aborted and t_end > cut and not unknown_changes(run.true, run.view):
            Recording.epochs.append((t_end - cut, run.plan, run.true, run.options(), x, cap_rate))


def pause_parts(job, old: Plan, decision, planning_s: float) -> dict:
    """reconfig_cost's pause (sched/reconfig.py) in its parts, checked against pause_s."""
    rc = decision.reconfig
    parts = {
        "planning": planning_s,
        "rebuild": COMM_REBUILD_S if rc.rebuilt_groups or old.replicas != decision.plan.replicas else 0.0,
        "bytes": transfer_s(rc.transfers, job.cluster),
    }
    parts["per_layer"] = rc.pause_s - sum(parts.values())
    layers = parts["per_layer"] / LAYER_FIXED_S
    assert parts["per_layer"] > -1e-9 and abs(layers - round(layers)) < 1e-6, (parts, rc.pause_s)
    return parts


def regular_plans(job, cluster):
    """Uniform layouts over the healthy live devices (TP groups inside nodes), every TP and PP."""
    gpn, model, gmb = cluster.gpus_per_node, job.model, job.global_microbatches
    healthy = [[x for x in range(n * gpn, (n + 1) * gpn) if cluster.alive[x] and cluster.speed[x] == 1.0]
               for n in range(cluster.nodes)]  # fmt: skip
    for tp in (k for k in (1, 2, 4, 8) if k <= gpn and k <= model.heads):
        groups = [g[k : k + tp] for g in healthy for k in range(0, len(g) - tp + 1, tp)]
        for pp in range(1, min(len(groups), model.num_layers, 2 * job.pp) + 1):
            dp = min(len(groups) // pp, gmb)
            if dp < 1:
                continue
            devices = [x for g in groups[: dp * pp] for x in g]
            for split in {even_split(model.num_layers, pp), _head_aware(model, pp)}:
                plan = Plan.uniform(model, tp, pp, dp, 1, job.schedule, devices=devices, layer_split=split)
                plan = plan.with_changes(microbatches=even_split(gmb, dp))
                if fits_memory(job, plan):
                    yield plan


def best_regular(job, cluster, opts, timer) -> tuple[float, str]:
    """(rate, "tp x pp x dp") of the fastest regular layout; (0, "") when none fits."""
    rated = [(timer.samples_per_s(p, cluster, opts), p) for p in regular_plans(job, cluster)]
    if not rated:
        return 0.0, ""
    x, p = max(rated, key=lambda r: r[0])
    return x, f"{p.replicas[0][0].tp}x{len(p.replicas[0])}x{p.dp}"


def best_reweight(job, plan: Plan, cluster, opts, timer) -> float:
    """The chosen plan with the global batch re-split over its replicas (no migration): every split
    for 2 replicas, else in proportion to each replica's rate alone; 0 when a stage is hollow."""
    if plan.dp < 2 or any(st.hollow for r in plan.replicas for st in r):
        return 0.0
    g = plan.global_microbatches
    if plan.dp == 2:
        splits = [(k, g - k) for k in range(1, g)]
    else:
        rates = [timer.samples_per_s(Plan(job.model, (r,), (m,), plan.schedule), cluster, opts)
                 for r, m in zip(plan.replicas, plan.microbatches)]  # fmt: skip
        splits = [split_by_weight(g, rates, 1)]
    plans = [plan.with_changes(assignment=(), microbatches=tuple(m)) for m in splits]
    return max((timer.samples_per_s(p, cluster, opts) for p in plans if fits_memory(job, p)), default=0.0)


def _head_aware(model, pp: int) -> tuple[int, ...]:
    caps = [model.num_layers] * pp
    return tuple(minmax_partition(model.num_layers, [1.0] * pp, caps, last_cost=head_layers(model)))


def analyse(path: Path, policy_name: str, seed: int = 0) -> dict:
    scenario = load_scenario(str(path))
    job = jobsim.with_seed(scenario, seed).job
    timer = jobsim.PlanTimer(job, seed)
    t0 = timer.iteration_s(job.initial_plan(), job.cluster)
    policy = POLICIES[policy_name]()
    decisions = []
    adapt = policy.adapt

    def logged(ctx_, plan, cluster, reports, **kw):
        decision = adapt(ctx_, plan, cluster, reports, **kw)
        decisions.append((plan, decision))
        return decision

    policy.adapt = logged
    Recording.epochs = []
    jobsim.LossAccount = Recording
    try:
        faults = jobsim.scenario_faults(jobsim.with_seed(scenario, seed), timer, seed, t0)
        run = jobsim._Run(jobsim.with_seed(scenario, seed), policy, seed, timer, faults).run()
    finally:
        jobsim.LossAccount = LossAccount
    bound = run.capacity_bound_samples_per_s * jobsim.horizon_s(scenario, t0)
    pause: dict = {"decisions": 0}
    for old, d in decisions:
        if d.plan is None or d.reconfig.pause_s <= 0:
            continue
        pause["decisions"] += 1
        for k, v in pause_parts(job, old, d, getattr(policy, "planning_s", 0.0)).items():
            pause[f"{k}_s"] = pause.get(f"{k}_s", 0.0) + v
    long = ResiHP(horizon_s=math.inf)
    horizon = jobsim.horizon_s(scenario, t0)
    x0 = jobsim.fault_free_samples_per_s(job, timer)
    winners: dict = {}  # best known plan ("chosen" or a regular layout) -> share of the run
    best: dict = {}
    steady = dict.fromkeys(
        ("gap", "to_long_horizon", "to_reweighted", "to_best_known", "to_best_known_scaled"), 0.0
    )
    healthy = best_regular(job, job.cluster, {}, timer)
    scale = x0 / healthy[0] if healthy[0] > 0 else 0.0  # regular layouts' rates rescaled to X0
    for dt, plan, cluster, opts, x, cap in Recording.epochs:
        key = (plan, cluster)
        if key not in best:
            try:
                alt = long.choose_plan(PlanningContext.of_job(job), plan, cluster)[1]
                x_long = timer.samples_per_s(alt, cluster, long.cost_options(cluster))
            except ValueError:
                x_long = 0.0
            x_reg, layout = best_regular(job, cluster, opts, timer)
            x_rew = best_reweight(job, plan, cluster, opts, timer)
            winner = (
                layout
                if x_reg > max(x, x_long, x_rew)
                else "reweighted"
                if x_rew > max(x, x_long)
                else "chosen"
            )
            best[key] = (max(x, x_long), max(x, x_long, x_reg, x_rew), winner, x_reg, max(x, x_rew))
        steady["gap"] += (cap - x) * dt
        steady["to_long_horizon"] += (best[key][0] - x) * dt
        steady["to_best_known"] += (best[key][1] - x) * dt
        steady["to_best_known_scaled"] += (max(x, best[key][3] * scale, best[key][4]) - x) * dt
        steady["to_reweighted"] += (best[key][4] - x) * dt
        winners[best[key][2]] = winners.get(best[key][2], 0.0) + dt / horizon
    return {
        "scenario": scenario.name, "policy": policy_name,
        "reached": run.samples_per_s / run.capacity_bound_samples_per_s, "lost": run.account["lost"],
        "pause": pause, "pause_share": {k: v * run.capacity_bound_samples_per_s / bound
                                        for k, v in pause.items() if k.endswith("_s")},
        "steady": {k: v / bound for k, v in steady.items()}, "states": len(best), "winners": winners,
        "x0": x0, "best_regular_healthy": healthy,
    }  # fmt: skip


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", nargs="*", default=["table6", "fig9", "fig10", "fig14"])
    ap.add_argument("--scenarios", default=str(ROOT / "scenarios" / "paper"))
    ap.add_argument("--out", default=str(ROOT / "results" / "loss-analysis"))
    ap.add_argument("--policy", default="resihp")
    args = ap.parse_args(argv)
    for family in args.family:
        for path in sorted(Path(args.scenarios, family).glob("*.toml")):
            out = analyse(path, args.policy)
            target = Path(args.out, args.policy, family, path.stem + ".json")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(out, sort_keys=True, indent=1) + "\n")
            steady = " ".join(f"{k} {v:.4f}" for k, v in out["steady"].items())
            print(f"{family}/{path.stem:28s} reached {out['reached']:.3f} {steady}", flush=True)


if __name__ == "__main__":
    main()
