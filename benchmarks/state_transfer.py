"""Bytes a replan moves, per replan kind: the transfer planner against its lower bound and against
the broadcast-all transfer it replaced (every source device broadcast all of its shards, with both
AdamW moments, to every member), at 70B / 256 GPUs and 405B / 16,384 GPUs, and measured on the
tiny CPU runtime.

Replan kinds, each from the uniform plan (`Plan.uniform`), 8 GPUs a node:
  tp-excluded   TP rank 0 of replica 0's stage 0 lost; the stage runs on the other tp - 1 (re-split)
  layers-moved  replica 0's last layer of stage 0 moves to stage 1
  migrated      one micro-batch of replica 0's stage 0 runs on replica 1 (assignment only)
  tp-resplit    replica 0's stage 0 re-split 2:1 between its two halves of ranks (a slow half)
  to-standby    TP rank 0 of replica 0's stage 0 goes to standby (alive: it still sends)
  back          ... and comes back to the uniform plan (it receives its whole shard)

"before" is computed, not run: the source stages are the first replica holding each tensor whose
devices all live (`transfer.source_stages`' rule); each source device's shard bytes went to every
other member of the new world. "after" is `core.transfer_plan.plan_transfer`; `planner_s` its
wall time (the fastest of three runs). With `--runtime` the tiny job (tp2 x pp2 x dp2, 8 gloo
workers) also runs every kind as planned replans and the measured bytes of each `state-transfer`
event are printed beside the planner's.

    PYTHONPATH=. .venv/bin/python benchmarks/state_transfer.py [--runtime] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import time

from resihp.core.model_spec import ModelSpec, model_preset
from resihp.core.plan import Plan, Stage, build_stage
from resihp.core.shard_layout import stage_param_names
from resihp.core.transfer_plan import KINDS, extent, interval, plan_transfer

GPUS_PER_NODE = 8
SCALES = (("llama2-70b", 8, 4, 8), ("llama3-405b", 8, 16, 128))


def _replace(plan: Plan, r: int, stages, **changes) -> Plan:
    reps = list(plan.replicas)
    reps[r] = tuple(stages)
    return plan.with_changes(replicas=tuple(reps), **changes)


def kinds(spec: ModelSpec, base: Plan) -> list[tuple[str, Plan, Plan, set[int]]]:
    """(kind, old plan, new plan, devices holding state) per replan kind."""
    s0, s1 = base.replicas[0][0], base.replicas[0][1]
    devs = set(base.devices())
    lost = s0.devices[0]
    excluded = _replace(base, 0, (build_stage(spec, s0.devices[1:], s0.layers), *base.replicas[0][1:]))
    lo, hi = s0.layers
    moved = _replace(
        base,
        0,
        (
            Stage(s0.devices, (lo, hi - 1), s0.tp_split, s0.ffn_split),
            Stage(s1.devices, (hi - 1, s1.layers[1]), s1.tp_split, s1.ffn_split),
            *base.replicas[0][2:],
        ),
    )
    migrated = base.with_changes(assignment=((0, 0, 0, 1),))
    half = len(s0.devices) // 2
    speeds = [2.0] * half + [1.0] * (len(s0.devices) - half)
    resplit = _replace(base, 0, (build_stage(spec, s0.devices, s0.layers, speeds), *base.replicas[0][1:]))
    standby = excluded.with_changes(standby=(lost,))
    return [
        ("tp-excluded", base, excluded, devs - {lost}),
        ("layers-moved", base, moved, devs),
        ("migrated", base, migrated, devs),
        ("tp-resplit", base, resplit, devs),
        ("to-standby", base, standby, devs),
        ("back", standby, base, devs - {lost}),
    ]


def broadcast_all(old: Plan, new: Plan, holding: set[int]) -> tuple[int, int]:
    """(total bytes received, bytes received by one member) of the replaced transfer: every member
    of the new world received every source device's buffer."""
    spec = old.model
    members = len(set(new.devices()) | set(new.standby))
    per_source: dict[int, int] = {}
    for name in stage_param_names(spec, (0, spec.num_layers)):
        k = int(name.split(".")[1]) if name.startswith("layers.") else 0 if name == "embed.weight" else -1
        k = spec.num_layers - 1 if k < 0 else k
        for stages in old.replicas:
            st = next(s for s in stages if s.layers[0] <= k < s.layers[1])
            if st.devices and set(st.devices) <= holding:
                for r, d in enumerate(st.devices):
                    a, b = interval(spec, name, st, r)
                    per_source[d] = per_source.get(d, 0) + (b - a) * extent(spec, name)[2] * 4 * KINDS
                break
    total = sum(per_source.values())
    return total * (members - 1), total


def planner_rows() -> list[dict]:
    rows = []
    for name, tp, pp, dp in SCALES:
        spec = model_preset(name)
        base = Plan.uniform(spec, tp, pp, dp, 8)
        for kind, old, new, holding in kinds(spec, base):
            times = []
            for _ in range(3):  # the fastest of three: the machine's load only adds
                t0 = time.perf_counter()
                plan = plan_transfer(old, new, holding, node_of=lambda d: d // GPUS_PER_NODE)
                times.append(time.perf_counter() - t0)
            dt = min(times)
            before_total, before_one = broadcast_all(old, new, holding)
            rows.append({"model": name, "gpus": tp * pp * dp, "kind": kind, "planner_s": round(dt, 4),
                         "before_bytes": before_total, "before_per_member_bytes": before_one,
                         **plan.figures()})  # fmt: skip
    return rows


def runtime_rows() -> list[dict]:
    """The tiny job through every kind as planned replans, one iteration each."""
    from resihp.runtime.config import TrainConfig
    from resihp.runtime.train import run_training

    spec = ModelSpec("t", 4, 32, 8, 2, 48, 256)
    base = Plan.uniform(spec, 2, 2, 2, 2)
    gens, names = [base], []
    for kind, old, new, _ in kinds(spec, base):
        if old != gens[-1]:
            gens.append(old)
            names.append("(to " + kind + "'s start)")
        gens.append(new)
        names.append(kind)
    config = TrainConfig(seq_len=32, iterations=len(gens) + 1, detect_slow=False)
    res = run_training(config, base, progress=False, replans=[(g, p) for g, p in enumerate(gens) if g])
    events = {e["generation"]: e for e in res["events"] if e["kind"] == "state-transfer"}
    rows = []
    for g in range(1, len(gens)):
        old, new = gens[g - 1], gens[g]
        holding = set(old.devices())
        plan = plan_transfer(old, new, holding, node_of=lambda d: 0)
        ev = events[g]
        measured = {
            "measured_bytes_moved": ev["bytes_moved"],
            "measured_max_received_bytes": ev["max_received_bytes"],
            "transfer_s": ev["transfer_s"],
        }
        before = broadcast_all(old, new, holding)[0]
        row = {"model": "tiny runtime", "gpus": 8, "kind": names[g - 1], "before_bytes": before}
        rows.append({**row, **plan.figures(), **measured})
    return rows


def gib(b: int, tiny: bool) -> str:
    """GiB at scale; bytes (KiB) for the tiny runtime."""
    return f"{b / 2**10:8.1f} KiB" if tiny else f"{b / 2**30:8.2f} GiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runtime", action="store_true", help="also run the tiny job through every kind")
    ap.add_argument("--json", help="write the rows as JSON")
    args = ap.parse_args()
    rows = planner_rows() + (runtime_rows() if args.runtime else [])
    print(f"{'model':>13} {'gpus':>6} {'kind':>26} {'before':>12} {'moved':>12} {'lower bound':>12} "
          f"{'max received':>12} {'planner s':>9}  measured moved / max received")  # fmt: skip
    for r in rows:
        tiny = r["model"] == "tiny runtime"
        meas = f"{r['measured_bytes_moved']} B / {r['measured_max_received_bytes']} B" if tiny else ""
        cols = [
            gib(r[k], tiny)
            for k in ("before_bytes", "bytes_moved", "lower_bound_bytes", "max_received_bytes")
        ]
        head = f"{r['model']:>13} {r['gpus']:>6} {r['kind']:>26}"
        print(f"{head} {' '.join(cols)} {r.get('planner_s', ''):>9}  {meas}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
