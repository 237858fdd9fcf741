"""Live adaptation to a 3x slow device on CPU, and the simulator's prediction of the adapted plan.

Default job (tiny LLaMA, tp 2 x pp 2 x dp 2, 8 gloo workers, 1F1B, 4 micro-batches of 128 tokens
per replica; `--layout tp1`: tp 1 x pp 2 x dp 4, device 1 then is a whole TP-1 stage), three runs on
the elastic runtime, one each:

* fault-free (`detect_slow` on, nothing injected: same runtime, same commit protocol);
* unmitigated: device 1 at speed 1/3 from iteration `--at`, adaptation off;
* adapted: the same fault, `detect_slow` on: `fail-slow` -> the scheduler's plan
  (`reconfig.replan_after_slow`; `--policy none`: the `rebalance_slow` rule, uneven TP split).

Steady state = the committed iterations from `--skip` iterations after the last replan (adapted)
or after the fault (unmitigated) to the end; samples/s = samples / Σ iteration time (`time_s`,
the slowest device's wall time up to STEP). Capacity bound = fault-free samples/s x Σ live speed / N.

Prediction (c): the CPU cost model is calibrated from the first half of the fault-free run's
steady state, from its own per-instruction times (F/B wall time including their TP collectives,
max over the TP group; `fit_linear_time` per group and F/B, `chunk_table`: the paper's MTP),
gradient sync per group from the measured ALLREDUCE (median), P2P from the fast tail (10th
percentile) of the measured RECV, plus an iteration-level offset (median of measured − predicted
over the same iterations: Python work between instructions and the commit round trip). The
adapted plan's stages cost their layer count x a per-layer row (the first stage's row over its
layers) plus, on the last stage, its extra work (LM head, loss), scaled by max over TP members of
(share of heads and FFN columns x tp / speed); then
`resihp.evaluator.pipeline.evaluate`. The fault-free second half is the held-out self-check.

    .venv/bin/python benchmarks/runtime_adapt.py [--iterations 40] [--layout tp1] [--policy none] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from dataclasses import replace

import numpy as np

from resihp.core.costs import Costs
from resihp.core.plan import Plan, Stage
from resihp.core.program import compile_plan
from resihp.core.trace_format import InstrRow
from resihp.cost.calibration import chunk_table, fit_linear_time, mape
from resihp.evaluator.pipeline import evaluate
from resihp.runtime.config import TrainConfig
from resihp.runtime.train import run_training

SLOW_DEVICE, SPEED = 1, 1.0 / 3.0
LAYOUTS = {
    "tp2": {"tp": 2, "pp": 2, "dp": 2},
    "tp1": {"tp": 1, "pp": 2, "dp": 4},
    # two workers on two cores: no oversubscription, so a sleeping slow worker donates no CPU
    "pp2": {"tp": 1, "pp": 2, "dp": 1, "workers": 2, "microbatches": 8},
}


def plan_of(d: dict) -> Plan:
    """A Plan from its `to_dict` form (the default job's model)."""
    replicas = tuple(
        tuple(
            Stage(tuple(s["devices"]), tuple(s["layers"]), tuple(s["tp_split"]), tuple(s["ffn_split"]))
            for s in r
        )
        for r in d["replicas"]
    )
    return Plan(
        TrainConfig().spec,
        replicas,
        tuple(d["microbatches"]),
        d["schedule"],
        tuple(tuple(a) for a in d["assignment"]),
        tuple(d["standby"]),
        d["generation"],
    )


def run(
    iterations: int, at: int | None, adapt: bool, layout: str = "tp2", policy: str | None = "resihp"
) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        faults = None
        if at is not None:
            faults = os.path.join(tmp, "faults.toml")
            with open(faults, "w") as f:
                f.write(
                    f"[[faults]]\nkind = 'slow'\ndevice = {SLOW_DEVICE}\nat_iter = {at}\nseverity = {SPEED}\n"
                )
        config = TrainConfig(iterations=iterations, faults=faults, detect_slow=adapt, **LAYOUTS[layout])
        if policy is None:  # the runtime's own rules
            return run_training(config, progress=False, policy=None)
        return run_training(replace(config, policy=policy), progress=False)


def steady(res: dict, first: int) -> dict:
    rows = [r for r in res["iterations"] if r["iter"] >= first]
    t = sum(r["time_s"] for r in rows)
    return {
        "from_iter": first,
        "iterations": len(rows),
        "samples_per_s": sum(r["samples"] for r in rows) / t,
        "iteration_s_mean": t / len(rows),
        "iteration_s_median": statistics.median(r["time_s"] for r in rows),
        "times": [r["time_s"] for r in rows],
    }


def calibrate(res: dict, first: int, last: int) -> tuple[dict, dict, float]:
    """(group -> (3, 3) chunk table, group -> allreduce s, p2p s) from the fault-free trace's
    iterations [first, last)."""
    plan = plan_of(res["plan"])
    config = TrainConfig()
    workload = config.workload()
    samples: dict[tuple, list] = {}
    allreduce: dict[tuple, list] = {}
    sends = []
    for rec in res["trace"]:
        if not first <= rec["iter"] < last:
            continue
        g = (rec["replica"], rec["stage"])
        for row in map(InstrRow.from_json, rec["instrs"]):
            wall = row.compute_s + row.comm_s
            if row.op in ("F", "B"):  # the chunk's wall time: its TP collectives are part of it
                k = plan.mb_offset(row.src) + row.mb
                samples.setdefault((g, row.op, rec["iter"], k), []).append(wall)
            elif row.op == "ALLREDUCE":
                allreduce.setdefault(g, []).append(wall)
            elif row.op == "RECV":  # includes waiting for the sender: its fast tail is the transfer
                sends.append(wall)
    fits: dict[tuple, list] = {}
    for (g, op, it, k), ts in samples.items():  # a TP group runs at its slowest member's pace
        sq = workload.pack(it, plan.global_microbatches).sum_sq[k]
        fits.setdefault((g, op), []).append((workload.seq_len, sq, max(ts)))
    table = {}
    for g in {g for g, _ in fits}:
        rows = {op: np.array(fits[g, op]) for op in ("F", "B")}
        lt = {op: fit_linear_time(r[:, 0], r[:, 1], r[:, 2]) for op, r in rows.items()}
        table[g] = chunk_table(lt["F"], lt["B"])
    return table, {g: statistics.median(v) for g, v in allreduce.items()}, float(np.percentile(sends, 10))


def predict(plan: Plan, base: Plan, table: dict, allreduce: dict, p2p: float, speeds: dict, it: int):
    """Predicted iteration time of `plan` at iteration `it`'s batch (without the iteration-level
    offset). Per replica, the base plan's calibrated rows are split into a per-layer row (the first
    stage's row over its layer count: the embedding lookup is taken as free) and the last stage's
    extra work (its row minus its layers: LM head and loss); a stage of `plan` costs its layer count
    x the per-layer row (+ the extra on the last stage), scaled by max over its TP members of (share
    of heads and FFN columns x base tp / speed). Migrated micro-batches run with their executor's
    rows (`compile_plan` orders them)."""
    spec, workload = plan.model, TrainConfig().workload()
    chunk, sync = {}, {}
    for d, stages in enumerate(plan.replicas):
        old = base.replicas[d]
        per_layer = table[d, 0] / (old[0].layers[1] - old[0].layers[0])
        head = table[d, len(old) - 1] - per_layer * (old[-1].layers[1] - old[-1].layers[0])
        sync_layer = allreduce[d, 0] / (old[0].layers[1] - old[0].layers[0])
        for i, st in enumerate(stages):
            if st.hollow:
                continue
            n = st.layers[1] - st.layers[0]
            scale = max(
                0.5 * (h / spec.heads + f / spec.ffn) * old[0].tp / speeds.get(dev, 1.0)
                for dev, h, f in zip(st.devices, st.tp_split, st.ffn_split)
            )
            last = st.layers[1] == spec.num_layers
            chunk[d, i] = (per_layer * n + (head if last else 0.0)) * scale
            sync[d, i] = sync_layer * n
    batch = workload.pack(it, plan.global_microbatches)
    costs = Costs(
        np.full(batch.count, float(batch.seq_len)),
        batch.sum_sq,
        chunk,
        p2p=lambda a, b: p2p,
        allreduce_s=sync,
    )
    return evaluate(compile_plan(plan), costs).iteration_s


def offset(res: dict, plan: Plan, table: dict, allreduce: dict, p2p: float, its: range) -> float:
    """Iteration-level calibration: the median of measured − predicted over iterations `its` of the
    fault-free run (Python work between instructions, the commit round trip: not in any chunk)."""
    measured = {r["iter"]: r["time_s"] for r in res["iterations"]}
    return statistics.median(measured[it] - predict(plan, plan, table, allreduce, p2p, {}, it) for it in its)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=40)
    ap.add_argument("--at", type=int, default=4, help="iteration at which the slowdown starts")
    ap.add_argument(
        "--skip", type=int, default=3, help="iterations after the fault / replan not in steady state"
    )
    ap.add_argument(
        "--layout", choices=sorted(LAYOUTS), default="tp2", help="tp1: a TP-1 stage; pp2: 2 workers"
    )
    ap.add_argument("--policy", default="resihp", help="scheduler policy of the adapted run; none: the rule")
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()
    policy = None if args.policy == "none" else args.policy
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print("before:", load, flush=True)
    free = run(args.iterations, None, True, args.layout, policy)
    slow = run(args.iterations, args.at, False, args.layout, policy)
    adapt = run(args.iterations, args.at, True, args.layout, policy)
    print("after: ", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    replans = [e for e in adapt["events"] if e["kind"] == "replan"]
    blamed = [e for e in adapt["events"] if e["kind"] == "fail-slow"]
    last = replans[-1]["iter"] if replans else args.at
    s_free = steady(free, args.skip)
    s_slow = steady(slow, args.at + args.skip)
    s_adapt = steady(adapt, last + args.skip)
    n = len(plan_of(free["plan"]).devices())
    bound = s_free["samples_per_s"] * (n - 1 + SPEED) / n
    # calibrate on the first half of the fault-free steady state; the second half is the held-out check
    half = (args.skip + args.iterations) // 2
    table, allreduce, p2p = calibrate(free, args.skip, half)
    plan0 = plan_of(free["plan"])
    c0 = offset(free, plan0, table, allreduce, p2p, range(args.skip, half))
    final = plan_of(adapt["plans"][-1])
    its = range(s_adapt["from_iter"], args.iterations)
    pred_adapt = [c0 + predict(final, plan0, table, allreduce, p2p, {SLOW_DEVICE: SPEED}, it) for it in its]
    rest = range(half, args.iterations)
    pred_free = [c0 + predict(plan0, plan0, table, allreduce, p2p, {}, it) for it in rest]
    held_out = [r["time_s"] for r in free["iterations"] if r["iter"] >= half]
    out = {
        "load": load,
        "fault_free": s_free,
        "unmitigated": s_slow,
        "adapted": s_adapt,
        "capacity_bound_samples_per_s": bound,
        "adapted_over_bound": s_adapt["samples_per_s"] / bound,
        "unmitigated_over_bound": s_slow["samples_per_s"] / bound,
        "fail_slow_events": blamed,
        "replans": replans,
        "adapted_plan_stage": adapt["plans"][-1]["replicas"][0][0],
        "predicted_adapted_s_mean": float(np.mean(pred_adapt)),
        "mape_adapted_pct": mape(pred_adapt, s_adapt["times"]),
        "mean_error_adapted_pct": 100 * (np.mean(pred_adapt) / s_adapt["iteration_s_mean"] - 1),
        "predicted_fault_free_s_mean": float(np.mean(pred_free)),
        "mape_fault_free_held_out_pct": mape(pred_free, held_out),
        "iteration_offset_s": c0,
        "p2p_s": p2p,
        "allreduce_s": {str(k): v for k, v in allreduce.items()},
    }
    for k in ("fault_free", "unmitigated", "adapted"):
        s = out[k]
        print(f"{k:12} from iter {s['from_iter']:3}: {s['samples_per_s']:7.2f} samples/s, "
              f"iteration {s['iteration_s_mean'] * 1e3:6.1f} ms mean, "
              f"{s['iteration_s_median'] * 1e3:6.1f} ms median")  # fmt: skip
    print(f"capacity bound {bound:.2f} samples/s; adapted/bound {out['adapted_over_bound']:.3f}; "
          f"unmitigated/bound {out['unmitigated_over_bound']:.3f}")  # fmt: skip
    print("fail-slow:", [(e["iter"], e["devices"], round(e["severity"], 3)) for e in blamed])
    print("replans:", [(e["iter"], e["reason"]) for e in replans], "stage r0s0:", out["adapted_plan_stage"])
    print(f"predicted adapted {out['predicted_adapted_s_mean'] * 1e3:.1f} ms vs measured "
          f"{s_adapt['iteration_s_mean'] * 1e3:.1f} ms: MAPE {out['mape_adapted_pct']:.1f} %, "
          f"mean error {out['mean_error_adapted_pct']:+.1f} %")  # fmt: skip
    print(f"predicted fault-free (held out: {half}-) {out['predicted_fault_free_s_mean'] * 1e3:.1f} ms "
          f"vs measured {np.mean(held_out) * 1e3:.1f} ms: MAPE {out['mape_fault_free_held_out_pct']:.1f} %; "
          f"iteration offset {c0 * 1e3:+.1f} ms")  # fmt: skip
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
    main()
