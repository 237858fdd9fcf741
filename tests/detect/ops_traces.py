"""Small Megatron-style per-operation traces for the `--ops-trace` tests, generated here (never
downloaded). Imported by module name (`tests/detect/conftest.py` puts this folder on sys.path).

Ranks are numbered as Megatron does (TP fastest, then DP, then PP): rank = tp_rank + tp·(dp_rank +
dp·stage). Per step and replica each micro-batch draws a workload factor (lognormal, `jitter`),
shared by every stage of that replica — the documents flow through the whole pipeline, and other
replicas get other documents; each rank adds its own noise (1% by default). A TP group's compute
lasts as long as its slowest member (`tp_drag`, the TP collectives inside the layers), or each
rank its own.
"""

from __future__ import annotations

import csv
import random

COLUMNS = ("rank", "dp_rank", "stage", "step", "optype", "start_ts", "duration", "mb_id", "mc", "gmc")
COMM = ("forward-send", "forward-recv", "backward-send", "backward-recv")
# The shape of the public sample traces of "Understanding Stragglers in Large Model Training Using
# What-if Analysis" (github.com/ByteDance-Seed/StragglerAnalysis, data/): the 44 step numbers of its
# result files (four clusters), its meta files' keys and layout (DP 4 x PP 4 x TP 4, world 64), and
# 16 ranks as in issue 16's example output, taken to be one rank per TP group. Only the shape: the
# rows are generated here.
SAMPLE_STEPS = (16, 21, 27, 29, 34, 35, 39, 404, 408, 413, 414, 415, 416, 419, 420, 421, 422, 423, 431,
                435, 439, 802, 809, 810, 811, 813, 818, 821, 825, 826, 831, 836, 837, 1204, 1205, 1211,
                1215, 1216, 1218, 1219, 1222, 1231, 1237, 1238)  # fmt: skip
SAMPLE_META = (
    "trial_name: X\nrun_id: 0\ndp_size: 4\ndsp_size: 1\npp_size: 4\ntp_size: 4\nvpp_size: 1\nworld_size: 64\n"
)


def synth_ops(dp=2, pp=4, tp=2, steps=range(44), mbs=4, stage_s=None, slow=None, jitter=0.08,
              bursts=(), tp_drag=True, keep=None, noise=0.01, seed=0) -> list[dict]:  # fmt: skip
    """Rows of a trace. `stage_s`: forward seconds per micro-batch per stage (default 0.1 each);
    `slow`: (rank, speed, from_step[, to_step]) — that rank computes at `speed` from `from_step`
    on (until before `to_step`);
    `bursts`: (replica, first_step, steps, factor) — long documents: that replica's work × factor
    for those steps, in every stage; `keep`: a predicate on rank (default all); `noise`: each
    rank's own lognormal noise per operation."""
    rng = random.Random(seed)
    stage_s = stage_s or [0.1] * pp
    end = slow[3] if slow and len(slow) > 3 else float("inf")
    clock = {}
    rows = []
    for t in steps:
        for d in range(dp):
            heavy = [f for rep, t0, n, f in bursts if rep == d and t0 <= t < t0 + n]
            work = [rng.lognormvariate(0.0, jitter) * (heavy[0] if heavy else 1.0) for _ in range(mbs)]
            for s in range(pp):
                group = [k + tp * (d + dp * s) for k in range(tp)]
                for j, w in enumerate(work):
                    for optype, mult in (("forward-compute", 1.0), ("backward-compute", 2.0)):
                        own = {}
                        for r in group:
                            speed = slow[1] if slow and r == slow[0] and slow[2] <= t < end else 1.0
                            own[r] = stage_s[s] * mult * w * rng.lognormvariate(0.0, noise) / speed
                        for r in group:
                            dur = max(own.values()) if tp_drag else own[r]
                            start = clock.get(r, 0.0)
                            rows.append(_row(r, d, s, t, optype, start, dur, j))
                            comm = COMM[0 if optype == "forward-compute" else 2]
                            rows.append(_row(r, d, s, t, comm, start + dur, 0.002, j))
                            clock[r] = start + dur + 0.002
                for r in group:
                    for optype in ("grads-reduce-scatter", "optimizer", "some-new-optype"):
                        rows.append(_row(r, d, s, t, optype, clock[r], 0.01, ""))
                        clock[r] += 0.01
    return [r for r in rows if keep is None or keep(r["rank"])]


def _row(rank, dp_rank, stage, step, optype, start, dur, mb) -> dict:
    return {"rank": rank, "dp_rank": dp_rank, "stage": stage, "step": step, "optype": optype,
            "start_ts": round(start, 6), "duration": round(dur, 6), "mb_id": mb, "mc": 0,
            "gmc": 0}  # fmt: skip


def write_csv(rows: list[dict], path, columns=COLUMNS) -> str:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(columns), extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return str(path)


def write_meta(path, dp=2, pp=4, tp=2, world=None, **extra) -> str:
    """A YAML (by name .yaml/.yml) or TOML meta file with the layout and `extra` keys."""
    world = dp * pp * tp if world is None else world
    items = {"dp_size": dp, "pp_size": pp, "tp_size": tp, "world_size": world, **extra}
    sep = ": " if str(path).endswith((".yaml", ".yml")) else " = "
    with open(path, "w") as fh:
        fh.writelines(f"{k}{sep}{v}\n" for k, v in items.items())
    return str(path)
