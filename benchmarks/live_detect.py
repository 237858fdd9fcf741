"""Live fail-slow detection on CPU: recorded `resihp train` timings replayed into three detectors.

Each run is a real `resihp train` job (default shape: tiny LLaMA, tp 2 x pp 2 x dp 2, 8 gloo
workers, 1F1B, 4 micro-batches per replica) with `--seq-len` (default 2048) tokens per micro-batch
of heavy-tailed `github` document lengths and document-aware attention, `--iters` (60) iterations,
adaptation off (`detect_slow = false`: the job keeps its plan, so every detector sees the same
series). Cases (`--cases`):

* `healthy`: nothing injected (one seed per run);
* `cotenant`: a process burning one core for 10 s, started `--cotenant-at` s after the job;
* `slow70`, `slow50`: `slow` at p = 0.7 / 0.5 from iteration 20 on the run's device (`fault_device`:
  a permutation of the devices per case, so that every 8 runs of a case cover every device);
* `slow0`: p = 0.5 from iteration 0;
* `recover`: p = 0.5 from iteration 15 for `--duration` s (`duration_s`), then back at speed.

A run's timings are recorded once (`--out DIR`, default `benchmarks/recordings/live_detect`, where
the recordings behind docs/detector.md's table are committed: one gzipped JSON per run, written
whole or not at all; an existing file is reused, not re-run),
run-major (every case of run 0, then of run 1, …: a recording
cut short leaves the cases balanced), and replayed into:

* `ours`: `runtime/adapt/slowwatch.SlowWatch`, the controller's live detector itself
  (`detect/online.py`: online MTP, ITP, change points, peer-aware localization, recovery);
* `filter`: the paper's 25 % filter (`ResiHPDetector`, mode "filter") on observed vs our ITP's
  prediction, then `Localizer` (relative, one iteration) on that iteration's chunks vs our MTP;
* `greyhound`: change points on the observed iteration time (`GreyhoundDetector`), then the same
  `Localizer`.

Per case and detector: runs, runs where the faulty device was reported at or after the onset
(`found`), wrong blames (any report of another device, or before the onset; healthy runs: any
report), median latency (report iteration − onset), median and worst severity error |p̂ − p| / p,
and for `recover` runs where ours reported `recovered` for the device after the fault ended. ITP
error: mean |observed − predicted| / observed over our healthy iterations, per case.

    .venv/bin/python benchmarks/live_detect.py --runs 10 --json live_detect.json
    .venv/bin/python benchmarks/live_detect.py --runs 10 --replay-only    # the committed recordings
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from resihp.core.files import write_atomic
from resihp.core.plan import Plan
from resihp.detect import DetectorConfig, GreyhoundDetector, LocalizeConfig, Localizer, ResiHPDetector
from resihp.detect.online import record_chunks
from resihp.runtime.adapt.slowwatch import SlowWatch
from resihp.runtime.config import TrainConfig
from resihp.runtime.job import WorkerFailed
from resihp.runtime.train import run_training

RECORDINGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "recordings", "live_detect")
CASES = ("healthy", "cotenant", "slow70", "slow50", "slow0", "recover")
ONSET = {"slow70": (20, 0.7), "slow50": (20, 0.5), "slow0": (0, 0.5), "recover": (15, 0.5)}
BURN = "import time\nend = time.perf_counter() + {s}\nwhile time.perf_counter() < end: pass\n"


def config_for(args, case: str, run: int, faults: str | None) -> TrainConfig:
    return TrainConfig(
        seq_len=args.seq_len, lengths="github", iterations=args.iters, data_seed=run, seed=run,
        detect_slow=False, faults=faults,
    )  # fmt: skip


def fault_device(case: str, run: int, devices: int = 8) -> int:
    """The device run `run` of `case` slows: a fixed permutation per case, so that any `devices`
    consecutive runs of a case cover every device."""
    order = np.random.default_rng([CASES.index(case), 7]).permutation(devices)
    return int(order[run % devices])


def record(args, case: str, run: int) -> dict:
    """Run one job; its trace, fault and co-tenant window (seconds from the job's start)."""
    device = fault_device(case, run, len(config_for(args, case, run, None).plan().devices()))
    fault = None
    with tempfile.TemporaryDirectory() as tmp:
        path = None
        if case in ONSET:
            at, p = ONSET[case]
            fault = {"device": device, "at_iter": at, "severity": p}
            text = f"[[faults]]\nkind = 'slow'\ndevice = {device}\nat_iter = {at}\nseverity = {p}\n"
            if case == "recover":
                text += f"duration_s = {args.duration}\n"
                fault["duration_s"] = args.duration
            path = os.path.join(tmp, "faults.toml")
            with open(path, "w") as f:
                f.write(text)
        cfg = config_for(args, case, run, path)
        burn = {}
        timer = None
        if case == "cotenant":

            def start() -> None:
                burn["start"] = time.perf_counter() - t0
                subprocess.run([sys.executable, "-c", BURN.format(s=10.0)], check=True)
                burn["end"] = time.perf_counter() - t0

            timer = threading.Timer(args.cotenant_at, start)
        t0 = time.perf_counter()
        if timer is not None:
            timer.start()
        res = run_training(cfg, progress=False)  # (WorkerFailed: the caller retries)
        if timer is not None:
            timer.join()
    end = next((e["iter"] for e in res["events"] if e["kind"] == "fault-end"), None)
    return {
        "case": case, "run": run, "fault": fault, "fault_end_iter": end, "cotenant": burn,
        "iter_time_s": [r["time_s"] for r in res["iterations"]], "trace": res["trace"],
    }  # fmt: skip


def replay(rec: dict, cfg: TrainConfig) -> dict:
    """Every detector's reports over one recorded run: {name: [(iteration, kind, device, p̂)]}."""
    plan: Plan = cfg.plan()
    workload = cfg.workload()
    watch = SlowWatch([plan], workload, cpu=True)
    base = {"filter": ResiHPDetector(DetectorConfig(), mode="filter"), "greyhound": GreyhoundDetector()}
    out: dict[str, list] = {"ours": [], "filter": [], "greyhound": []}
    by_iter: dict[int, list] = {}
    for r in rec["trace"]:
        by_iter.setdefault(r["iter"], []).append(r)
    det = watch.detector
    for it in sorted(by_iter):
        recs = sorted(by_iter[it], key=lambda r: r["device"])
        for rep in watch.observe(it, 0, recs):
            out["ours"].append((it, rep.kind, rep.devices[0], rep.severity))
        predicted = det.predicted.get(it)
        if predicted is None:
            continue
        observed = max(r["wall_s"] for r in recs)
        batch = workload.pack(it, plan.global_microbatches)
        for name, d in base.items():
            alarm = d.observe(it, observed, predicted)
            if alarm is None:
                continue
            loc = Localizer(LocalizeConfig(window_iters=1))
            compute = {}
            for r in recs:
                ch = record_chunks(plan, batch, r)
                pred = det.mtp.predict(det.classes[r["device"]], ch)
                ok = (ch.measured >= det.config.min_chunk_s) & (pred > 0)
                compute[r["device"]] = (ch.measured[ok], pred[ok])
            loc.observe(it, compute)
            reps = loc.localize(it)
            if reps:
                out[name].append((it, "fail-slow", reps[0].devices[0], reps[0].severity))
    return {"reports": out, "itp_error": float(np.mean(det.itp_errors)) if det.itp_errors else None}


def score(rec: dict, reports: list) -> dict:
    fault = rec["fault"]
    slow = [r for r in reports if r[1] == "fail-slow"]
    if fault is None:
        return {"found": None, "wrong": len(slow), "latency": None, "sev_err": None, "recovered": None}
    onset, dev, p = fault["at_iter"], fault["device"], fault["severity"]
    hit = next((r for r in slow if r[0] >= onset and r[2] == dev), None)
    wrong = sum(1 for r in slow if r[2] != dev or r[0] < onset)
    recovered = None
    if rec["fault_end_iter"] is not None:
        recovered = any(
            r[1] == "recovered" and r[2] == dev and r[0] >= rec["fault_end_iter"] for r in reports
        )
    return {
        "found": hit is not None, "wrong": wrong, "latency": None if hit is None else hit[0] - onset,
        "sev_err": None if hit is None else abs(hit[3] - p) / p, "recovered": recovered,
    }  # fmt: skip


def table(results: list[dict]) -> list[dict]:
    rows = []
    for case in CASES:
        runs = [r for r in results if r["case"] == case]
        if not runs:
            continue
        errs = [r["itp_error"] for r in runs if r["itp_error"] is not None]
        for name in ("ours", "filter", "greyhound"):
            s = [r["scores"][name] for r in runs]
            lat = [x["latency"] for x in s if x["latency"] is not None]
            sev = [x["sev_err"] for x in s if x["sev_err"] is not None]
            rec = [x["recovered"] for x in s if x["recovered"] is not None]
            rows.append({
                "case": case, "detector": name, "runs": len(s),
                "found": None if s[0]["found"] is None else sum(x["found"] for x in s),
                "wrong_blames": sum(x["wrong"] for x in s),
                "runs_with_wrong_blame": sum(x["wrong"] > 0 for x in s),
                "median_latency": statistics.median(lat) if lat else None,
                "median_sev_err": round(statistics.median(sev), 3) if sev else None,
                "max_sev_err": round(max(sev), 3) if sev else None,
                "recovered": sum(rec) if name == "ours" and rec else None,
                "itp_error": round(float(np.mean(errs)), 4) if errs and name == "ours" else None,
            })  # fmt: skip
    return rows


def markdown(rows: list[dict]) -> str:
    head = ["case", "detector", "runs", "found", "runs_with_wrong_blame", "wrong_blames", "median_latency",
            "median_sev_err", "max_sev_err", "recovered", "itp_error"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join("–" if r[k] is None else str(r[k]) for k in head) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--duration", type=float, default=40.0, help="recover: the fault's duration_s")
    ap.add_argument("--cotenant-at", type=float, default=90.0, help="seconds after the job starts")
    ap.add_argument("--out", default=RECORDINGS, help="recorded runs (reused when present)")
    ap.add_argument("--json")
    ap.add_argument("--replay-only", action="store_true", help="replay the recorded runs, record none")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    results = []
    cases = args.cases.split(",")
    for case in cases:
        if case not in CASES:
            print(f"--cases: {case!r}: allowed: {', '.join(CASES)}", file=sys.stderr)
            sys.exit(2)
    for run in range(args.runs):
        for case in cases:
            path = os.path.join(args.out, f"{case}-{run}-s{args.seq_len}-i{args.iters}.json.gz")
            if os.path.exists(path):
                with gzip.open(path) as f:
                    rec = json.load(f)
            elif args.replay_only:
                continue
            else:
                t = time.perf_counter()
                try:
                    rec = record(args, case, run)
                except WorkerFailed as e:  # a start timeout under load spikes (shared cores): once more
                    print(f"{case} {run}: {str(e)[:120]}; again", file=sys.stderr, flush=True)
                    rec = record(args, case, run)
                # whole or not at all: an interrupted run leaves none (mtime 0: same run, same bytes)
                write_atomic(path, gzip.compress(json.dumps(rec, separators=(",", ":")).encode(), mtime=0))
                print(f"recorded {path} in {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
            cfg = config_for(args, case, run, None)
            got = replay(rec, cfg)
            results.append({
                "case": case, "run": run, "fault": rec["fault"], "itp_error": got["itp_error"],
                "reports": got["reports"], "scores": {k: score(rec, v) for k, v in got["reports"].items()},
            })  # fmt: skip
    rows = table(results)
    print(markdown(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows, "runs": results}, f, indent=1)


if __name__ == "__main__":
    main()
