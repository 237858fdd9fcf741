"""Cost of one detector update at cluster scale (wall-clock; not part of the deterministic JSON).

One update = what the controller does per iteration: the ITP prediction for this iteration's
micro-batches (`evaluate` on the Program with fitted rows), one `ResiHPDetector.observe`, and one
`Localizer.observe_arrays` with every device's compute-only chunk times. Layout: LLaMA 2-70B, TP 4,
PP 16 (the paper's XLarge row), DP = devices / 64, 8 micro-batches of 8K tokens, 1F1B; the
iteration time it is compared with is the analytical cost model's prediction for that plan.
"""

from __future__ import annotations

import time

import numpy as np

from resihp.core.cluster import Cluster
from resihp.core.model_spec import model_preset
from resihp.core.plan import Plan
from resihp.core.scenario import Job
from resihp.core.workload import Workload
from resihp.cost.calibration import LinearTime
from resihp.evaluator.predict import predict

from .changepoint import ResiHPDetector
from .itp import ITP
from .localize import Localizer


def update_time(devices: int, repeats: int = 20, seed: int = 0) -> dict:
    """Median seconds of one detector update at `devices` devices, and its share of an iteration."""
    tp, pp, m, seq = 4, 16, 8, 8192
    dp = devices // (tp * pp)
    if dp < 1 or dp * tp * pp != devices:
        raise ValueError(f"overhead: devices = {devices}: must be a multiple of {tp * pp}")
    model = model_preset("llama2-70b")
    cluster = Cluster(devices // 8, 8, "a100-80g")
    job = Job(model, cluster, Workload(seq, m, "github", seed), tp, pp, dp, "1f1b")
    plan = Plan.uniform(model, tp, pp, dp, m, "1f1b")
    pred = predict(job, plan, cluster)
    costs_rows = {}
    for g, table in pred_costs(job, plan, cluster).items():
        for k, name in enumerate("FBW"):
            costs_rows[(g, name)] = LinearTime(*table[k])
    itp = ITP(plan, costs_rows)
    det = ResiHPDetector(mode="normalize")
    loc = Localizer()
    rng = np.random.default_rng(seed)
    per_dev = 3 * m
    ids = np.repeat(np.arange(devices), per_dev)
    times = []
    for t in range(repeats + 15):
        batch = job.workload.pack(t, plan.global_microbatches)
        tokens = np.full(batch.count, float(seq))
        measured = np.exp(0.01 * rng.standard_normal(ids.size)) * 0.05
        start = time.perf_counter()
        p = itp.predict(tokens, batch.sum_sq)
        det.observe(t, p * (1.0 + 0.01 * rng.standard_normal()), p)
        loc.observe_arrays(t, ids, measured, np.full(ids.size, 0.05))
        if t >= 15:  # the detector needs 10+ points before it decides anything
            times.append(time.perf_counter() - start)
    med = float(np.median(times))
    return {
        "devices": devices,
        "update_ms": round(med * 1e3, 3),
        "iteration_s": round(pred.iteration_s, 3),
        "share_of_iteration_pct": round(100 * med / pred.iteration_s, 4),
    }


def pred_costs(job: Job, plan: Plan, cluster: Cluster) -> dict:
    """The analytical model's chunk rows per group: stand-ins for fitted MTP rows."""
    from resihp.cost import build_costs

    batch = job.workload.pack(0, plan.global_microbatches)
    tokens = np.full(batch.count, float(job.workload.seq_len))
    return build_costs(job.model, plan, cluster, tokens, batch.sum_sq).chunk
