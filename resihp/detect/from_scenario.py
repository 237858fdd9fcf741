"""`resihp detect --scenario`: synthesize a scenario's timing trace (`jobs.JobModel`) and replay it.

The scenario's uniform Plan is simulated replica by replica (each replica is one pipeline; the
iteration lasts as long as its slowest replica), on the scenario's own micro-batches
(`Workload.pack(iteration, G)`), for `run.iterations` iterations or `run.duration_s` over the
predicted healthy iteration time (at most `MAX_ITERS`). `slow` faults slow one device; `link`
faults slow one P2P rank pair between adjacent stages of a replica. Fail-stop and re-join are the
heartbeats' business (`runtime/control/liveness.py`) and are skipped with a warning, as are links
that carry no pipeline traffic. Named fault generators are expanded as the job simulator expands
them (seed 0).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from resihp.core.scenario import Scenario
from resihp.evaluator.predict import predict

from .jobs import JobModel
from .replay import Sample, replay

MAX_ITERS = 2000
DATE_TOLERANCE = 3


def _faults(scenario: Scenario, iteration_s: float, iters: int, warn) -> tuple[list, list]:
    job = scenario.job
    tp, pp = job.tp, job.pp
    per = tp * pp
    by_replica: list[list] = [[] for _ in range(job.dp)]
    truth = []
    for f in _expand(scenario, iteration_s):
        if f.kind not in ("slow", "link"):
            warn(f"faults: a {f.kind} fault is detected by heartbeats, not timing; skipped")
            continue
        onset = f.at_iter if f.at_iter is not None else int(f.at_s / iteration_s)
        end = None if f.duration_s is None else onset + max(1, int(f.duration_s / iteration_s))
        if onset >= iters:
            warn(f"faults: the {f.kind} fault at iteration {onset} is after the last iteration; skipped")
            continue
        if f.kind == "slow":
            d, local = divmod(f.device, per)
            by_replica[d].append(("slow", onset, local // tp, local % tp, float(f.severity), end))
            truth.append({"iter": onset, "kind": "fail-slow", "devices": [f.device], "severity": f.severity})
            continue
        (d1, a), (d2, b) = divmod(min(f.src, f.dst), per), divmod(max(f.src, f.dst), per)
        if d1 != d2 or b // tp != a // tp + 1 or a % tp != b % tp:
            warn(f"faults: link {f.src}-{f.dst} carries no pipeline transfer in this plan; skipped")
            continue
        by_replica[d1].append(("link", onset, a // tp, a % tp, float(f.severity), end))
        link = [min(f.src, f.dst), max(f.src, f.dst)]
        truth.append({"iter": onset, "kind": "link-slow", "link": link, "severity": f.severity})
    return by_replica, sorted(truth, key=lambda t: t["iter"])


def _expand(scenario: Scenario, iteration_s: float) -> tuple:
    """The scenario's fault list; a named generator is expanded as the job simulator does."""
    if not scenario.generator:
        return scenario.faults
    from resihp.sim.job import scenario_faults
    from resihp.sim.timing import PlanTimer

    return tuple(scenario_faults(scenario, PlanTimer(scenario.job, 0), 0, iteration_s))


def synthesize(scenario: Scenario, seed: int = 0, warn: Callable[[str], None] = lambda s: None):
    """(samples, plans, batch, truth, itp_options) of the scenario's synthetic run; the ITP gets the
    cost model's healthy transfer and step times (the trace replay has none and predicts without)."""
    job = scenario.job
    plan = job.initial_plan()
    iteration_s = predict(job, plan, job.cluster).iteration_s
    if scenario.iterations is not None:
        iters = scenario.iterations
    else:
        iters = int(scenario.duration_s / iteration_s)
    if iters > MAX_ITERS:
        warn(f"run: {iters} iterations; synthesizing the first {MAX_ITERS}")
        iters = MAX_ITERS
    iters = max(iters, 1)
    wl, tp, pp, dp = job.workload, job.tp, job.pp, job.dp
    m, g = wl.num_microbatches, job.global_microbatches
    layout = (job.model, tp, pp, m, plan.schedule)
    jm = JobModel(wl.seq_len, wl.lengths, wl.seed, iters, 0.0, layout, job.cluster, g)
    faults, truth = _faults(scenario, iteration_s, iters, warn)
    idx = np.arange(iters)[None, :, None] * g + np.arange(dp)[:, None, None] * m + np.arange(m)[None, None, :]
    rng = np.random.default_rng(np.random.SeedSequence([seed, 11]))
    blk = jm.block(rng, dp, iters, faults, idx)
    observed = blk.observed_s.max(axis=0)
    shape = blk.device_s.shape[2:]  # (pp, tp, 3, m)
    d, s, r, k, j = np.indices((dp, *shape)).reshape(5, -1)
    devices = d * tp * pp + jm.devices[s, r]
    groups = list(zip(d.tolist(), s.tolist()))
    mbs = d * m + j
    pd, _, pb, _, pr = np.indices(blk.piece_s.shape[:1] + blk.piece_s.shape[2:]).reshape(5, -1)
    links = np.stack([pd * tp * pp + jm.devices[pb, pr], pd * tp * pp + jm.devices[pb + 1, pr]], axis=1)
    samples = [
        Sample(t, 0, float(observed[t]), devices, groups, k, mbs, blk.device_s[:, t].ravel(), links,
               blk.piece_s[:, t].ravel())
        for t in range(iters)
    ]  # fmt: skip
    pool_sq = jm.pool[0]

    def batch(t: int, count: int):
        return np.full(count, float(wl.seq_len)), pool_sq[t * g : t * g + count]

    xfer = (jm.piece_alpha + jm.piece_wire).max(-1)  # (pp − 1,) healthy transfer per boundary

    def p2p(a, b) -> float:
        return float(xfer[min(a[1], b[1])]) if a[0] == b[0] and abs(a[1] - b[1]) == 1 else 0.0

    return samples, {0: plan}, batch, truth, {"p2p": p2p, "step_s": jm.step_s}


def score(result: dict, truth: list, warmup: int) -> None:
    """Per detector, against the first true fault after the warm-up: false alarms and detection
    latency (in place). Faults during the warm-up are for `warmup_reports`."""
    later = [t for t in truth if t["iter"] >= warmup]
    onset = later[0]["iter"] if later else None
    for res in result["detectors"].values():
        false, latency = 0, None
        for a in res["alarms"]:
            if onset is None or a["detected_at"] < onset or a["iteration"] < onset - DATE_TOLERANCE:
                false += 1
            elif latency is None:
                latency = a["detected_at"] - onset
        res["false_alarms"] = false
        res["detected"] = latency is not None if onset is not None else None
        res["latency_iters"] = latency


def run_scenario(
    scenario: Scenario, seed: int = 0, warmup: int = 10, warn=lambda s: None, watch=None
) -> dict:
    samples, plans, batch, truth, itp_options = synthesize(scenario, seed, warn)
    out = replay(samples, plans, batch, warmup=warmup, itp_options=itp_options, watch=watch)
    score(out, truth, warmup)
    return {"scenario": scenario.name, "seed": seed, "iterations": len(samples), "truth": truth, **out}
