"""A `Hardware` calibrated from the runtime's own trace, for the scheduler policy (torch-free).

The controller replans through a `resihp.sched` policy, whose cost model (`resihp.cost`) prices a
plan on a Hardware. The `cpu` preset is a placeholder: it prices the tests' F chunk at 30 µs where
the runtime measures 2 ms, and a 4 KB activation at 50 µs where the link model (`run.link_mb_per_s`)
makes it last 16 ms — so the policy saw no slow link worth acting on. `calibrate_hardware` fits the
preset to one iteration's trace records (the controller passes the first baseline iteration that
`SlowWatch` takes, healthy by construction of its detector):

- compute: `measured ≈ layer_overhead_s·L + predicted / s` over the iteration's chunks (F; B + W:
  under 1F1B the runtime's B includes the weight gradient), `predicted` the preset's compute-only
  time (`build_costs` without TP communication), L the chunk's layers, fitted on relative residuals
  with outlier rejection (`fit_linear_time`); s scales the preset's FLOP rate and memory bandwidth.
  When the FLOP term comes out <= 0 (the tiny CPU models: fixed per-operator costs dominate; the
  runtime measures B + W ≈ F and the LM-head stage no slower than the others, where FLOPs say 2 F
  and 1.5 times) the preset's rate is kept and the overhead fitted alone; when the overhead comes
  out < 0, the factor s alone. Per-device speeds stay in `Cluster.speed`;
- collective latency (`alpha_intra_s`, `alpha_inter_s`): from the TP all-reduces inside F and B
  (their `comm_s`, the least over the TP group: its last member to arrive waits least), 4 per layer
  per TP step; without TP groups from the gradient all-reduce (`ALLREDUCE` `comm_s`, least over
  each DP ring, 2(n − 1) steps); the preset's otherwise;
- P2P (`p2p_bw`, `alpha_p2p_s`, which only pipeline transfers use): with the link model on, its
  nominal bandwidth, exactly, converted from the runtime's fp32 blocks to the cost model's bf16
  activations, and as latency the median excess of the measured transfers over nominal (sleep
  overshoot); without it, the median measured transfer time as latency.
"""

from __future__ import annotations

import statistics

import numpy as np

from resihp.core.cluster import Cluster
from resihp.core.plan import Plan
from resihp.core.trace_format import COMPUTE_OPS
from resihp.cost.build import build_costs
from resihp.cost.calibration import fit_linear_time
from resihp.cost.comm import Links, tp_comm_coeffs
from resihp.cost.hardware import Hardware, hardware_preset

MODEL_VALUE_BYTES = 2.0  # the cost model's activations and input gradients are bf16 (cost/build.py)
RUNTIME_VALUE_BYTES = 4.0  # the runtime's P2P blocks are fp32 (the trace's `bytes`)


def calibrate_hardware(
    plan: Plan, workload, records: list[dict], link_mb_per_s: float = 0.0, base: str | Hardware = "cpu"
) -> Hardware:
    """`base` fitted to `records` (one trace record per plan device, one iteration, run under
    `plan` on `workload`; docs/trace-format.md). Fields without samples keep `base`'s values."""
    hw0 = hardware_preset(base)
    n = max([*plan.devices(), *plan.standby]) + 1
    cluster = Cluster(1, n, hw0)
    batch = workload.pack(records[0]["iter"], plan.global_microbatches)
    tokens = np.full(batch.count, float(batch.seq_len))
    costs = build_costs(plan.model, plan, cluster, tokens, batch.sum_sq, hw0, tp_exposed=0.0)
    changes: dict = {"name": f"{hw0.name}-calibrated"}
    samples = compute_samples(plan, costs, records)
    if samples:
        s, overhead = fit_compute(*np.asarray(samples, dtype=np.float64).T)
        changes.update(peak_flops=hw0.peak_flops * s, hbm_bw=hw0.hbm_bw * s, layer_overhead_s=overhead)
    alpha = _collective_alpha(plan, Links(cluster, hw0), records, float(batch.seq_len))
    if alpha is not None:
        changes.update(alpha_intra_s=alpha, alpha_inter_s=alpha)
    blocks = [
        (row.nbytes, row.transfer_s) for r in records for row in r.get("links", ()) if row.transfer_s > 0
    ]
    if link_mb_per_s > 0:
        nominal = link_mb_per_s * 1e6
        changes["p2p_bw"] = nominal * MODEL_VALUE_BYTES / RUNTIME_VALUE_BYTES
        if blocks:
            changes["alpha_p2p_s"] = statistics.median(max(0.0, t - b / nominal) for b, t in blocks)
    elif blocks:
        changes["alpha_p2p_s"] = statistics.median(t for _, t in blocks)
    return hw0.with_changes(**changes)


def compute_samples(plan: Plan, costs, records: list[dict]) -> list[tuple[int, float, float]]:
    """(layers, predicted s, measured s) of every chunk in `records` (F; B + W), predicted by `costs`
    (a `build_costs` result for `plan` and the records' batch, without layer overhead)."""
    out = []
    for rec in records:
        table = costs.chunk.get((rec["replica"], rec["stage"]))
        if table is None:
            continue
        layers = plan.replicas[rec["replica"]][rec["stage"]].num_layers
        measured: dict[tuple, float] = {}
        for row in rec["instrs"]:
            if row.op in COMPUTE_OPS:
                key = (row.op == "F", row.src, row.mb)
                measured[key] = measured.get(key, 0.0) + row.compute_s
        for (forward, src, mb), t in measured.items():
            k = plan.mb_offset(src) + mb
            row = table[0] if forward else table[1] + table[2]
            predicted = float(row[0] + row[1] * costs.tokens[k] + row[2] * costs.sum_sq[k])
            if t > 0 and predicted > 0 and layers > 0:
                out.append((layers, predicted, t))
    return out


def fit_compute(layers, predicted, measured) -> tuple[float, float]:
    """(s, layer overhead s) with measured ≈ overhead·layers + predicted / s (module docstring)."""
    fit = fit_linear_time(layers, predicted, measured, intercept=False)
    if fit.beta > 0 and fit.alpha >= 0:
        return 1.0 / fit.beta, fit.alpha
    if fit.beta <= 0:  # FLOPs explain none of it: the preset's rate, the rest is overhead
        return 1.0, max(0.0, float(np.median((measured - predicted) / layers)))
    return float(np.median(predicted / measured)), 0.0


def _collective_alpha(plan: Plan, links: Links, records: list[dict], tokens: float) -> float | None:
    """Latency per collective step from TP all-reduces in F/B, else from the gradient all-reduce."""
    by_dev = {r["device"]: r for r in records}
    samples = []
    for stages in plan.replicas:
        for st in stages:
            if st.tp < 2 or not all(d in by_dev for d in st.devices):
                continue
            _, per_token = tp_comm_coeffs(plan.model.hidden, st.num_layers, st.devices, links)
            steps = 4 * st.num_layers * (st.tp - 1)  # 2 all-reduces per layer, 2 (t - 1) steps each
            comm: dict[tuple, float] = {}
            for d in st.devices:
                for row in by_dev[d]["instrs"]:
                    if row.op in ("F", "B"):
                        key = (row.op, row.src, row.mb)
                        comm[key] = min(comm.get(key, np.inf), row.comm_s)
            samples += [max(0.0, t - per_token * tokens) / steps for t in comm.values()]
    if samples:
        return statistics.median(samples)
    rings: dict[tuple, list[tuple[int, ...]]] = {}  # layers -> the groups whose gradients reduce together
    for stages in plan.replicas:
        for st in stages:
            if not st.hollow:
                rings.setdefault(st.layers, []).append(st.devices)
    for groups in rings.values():
        times = [
            row.comm_s
            for devs in groups
            for d in devs
            if d in by_dev
            for row in by_dev[d]["instrs"]
            if row.op == "ALLREDUCE"
        ]
        if len(groups) > 1 and times:
            samples.append(min(times) / (2 * (len(groups) - 1)))
    return statistics.median(samples) if samples else None
