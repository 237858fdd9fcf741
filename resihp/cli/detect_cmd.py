"""`resihp detect`: run the fail-slow detectors on a synthesized scenario, a runtime trace, or the
paper's accuracy protocol (`bench`), side by side with the Greyhound-style baseline (architecture §5.4);
or, with `--ops-trace FILE --meta META`, ours on a per-operation trace of another training system
(`resihp.detect.ops_detect`).

Exit status: 0 on success, 2 on a user error (bad file, bad option; one line on stderr).
"""

from __future__ import annotations

import sys

from resihp.core.files import check_input, check_outputs

from .common import table, write_json

BENCH_DEFAULTS = {"jobs": 400, "seed": 8}  # seed 8: the reported run (docs/detector.md)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "detect",
        help="fail-slow detection: --scenario FILE, --trace FILE.jsonl, --ops-trace FILE --meta META, "
        "or 'bench' (accuracy protocol)",
    )
    p.add_argument("action", nargs="?", choices=["bench"], help="bench: the paper's accuracy protocol")
    p.add_argument("--scenario", help="scenario TOML to synthesize (or --trace's workload)")
    p.add_argument("--trace", help="runtime trace, JSON lines (docs/trace-format.md)")
    p.add_argument(
        "--ops-trace", help="per-operation trace of another system, .csv or .parquet (docs/detector.md)"
    )
    p.add_argument(
        "--meta", help="--ops-trace's layout: dp_size, pp_size, tp_size, world_size (.yaml or .toml)"
    )
    p.add_argument("--schedule", default=None, help="schedule of --trace (default: scenario's, else 1f1b)")
    p.add_argument("--warmup", type=int, default=10, help="iterations per Plan generation to fit the MTP")
    p.add_argument(
        "--watch",
        default=None,
        help="always-on localization FACTOR,K: report a device/link below FACTOR for K iterations",
    )
    p.add_argument("--jobs", type=int, default=BENCH_DEFAULTS["jobs"], help="bench: jobs per setting")
    p.add_argument("--seed", type=int, default=None, help="random seed (bench default 8, else 0)")
    p.add_argument("--iters", type=int, default=300, help="bench: iterations per job")
    p.add_argument("--seq-lens", default="8192,16384,32768", help="bench: tokens per micro-batch, comma list")
    p.add_argument("--lengths", default="github,c4", help="bench: length distributions, comma list")
    p.add_argument("--faults", default="W,M,S,link", help="bench: fault settings, comma list")
    p.add_argument("--burst-prob", type=float, default=0.02, help="bench: long-document bursts per iteration")
    p.add_argument("--workers", type=int, default=1, help="bench: processes (results do not depend on it)")
    p.add_argument("--overhead", action="store_true", help="bench: time one update at 256/16,384 devices")
    p.add_argument("--json", dest="json_out", help="write the result as JSON ('-' for stdout)")
    p.set_defaults(run=run)


def _warn(msg: str) -> None:
    print(f"resihp: warning: {msg}", file=sys.stderr)


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(args) -> int:
    check_outputs({"--json": args.json_out}, stdout=("--json",))
    if args.ops_trace or args.meta:
        return _ops_trace(args)
    if args.action == "bench":
        if args.scenario or args.trace:
            raise ValueError("detect bench: takes no --scenario or --trace")
        return _bench(args)
    if not args.scenario and not args.trace:
        raise ValueError("detect: give --scenario FILE, --trace FILE.jsonl, or the 'bench' action")
    if args.warmup < 2:
        raise ValueError(f"--warmup {args.warmup}: must be >= 2")
    watch = _parse_watch(args.watch)
    if args.trace:
        check_input(args.trace, "--trace")
    from resihp.core.scenario import load_scenario

    scenario = load_scenario(args.scenario, "--scenario") if args.scenario else None
    seed = 0 if args.seed is None else args.seed
    if args.trace:
        out = _replay_trace(args, scenario, watch)
    else:
        from resihp.detect.from_scenario import run_scenario

        out = run_scenario(scenario, seed=seed, warmup=args.warmup, warn=_warn, watch=watch)
    _print_detections(out)
    if args.json_out:
        write_json(out, args.json_out)
    return 0


def _replay_trace(args, scenario, watch) -> dict:
    import numpy as np

    from resihp.detect.replay import replay, samples_from_trace
    from resihp.detect.trace_io import read_trace

    schedule = args.schedule or (scenario.job.schedule if scenario else "1f1b")
    try:
        records = read_trace(args.trace, warn=_warn)
    except UnicodeDecodeError:
        raise ValueError(f"--trace {args.trace}: not UTF-8 text; a trace is UTF-8 JSON lines") from None
    samples, plans = samples_from_trace(records, schedule)
    if scenario is not None:
        wl = scenario.job.workload

        def batch(t, count):
            return np.full(count, float(wl.seq_len)), wl.pack(t, count).sum_sq

    else:
        _warn("no --scenario: document lengths unknown, the MTP fits a constant per chunk")

        def batch(t, count):
            return np.ones(count), np.zeros(count)

    out = replay(samples, plans, batch, warmup=args.warmup, watch=watch)
    return {"trace": args.trace, "iterations": len(samples), "generations": sorted(plans), **out}


def _ops_trace(args) -> int:
    from resihp.detect.ops_detect import analyse_ops
    from resihp.detect.ops_meta import read_meta
    from resihp.detect.ops_trace import read_ops_trace

    if args.action or args.scenario or args.trace or args.watch:
        raise ValueError("detect --ops-trace: takes no 'bench', --scenario, --trace or --watch")
    if not (args.ops_trace and args.meta):
        raise ValueError("detect: --ops-trace FILE and --meta META go together; give both")
    check_input(args.ops_trace, "--ops-trace")
    report = analyse_ops(read_ops_trace(args.ops_trace, read_meta(args.meta, "--meta"), "--ops-trace"))
    if report.unjudged:
        names = ", ".join(map(str, report.unjudged))
        _warn(f"{len(report.unjudged)} rank(s) not judged: no peer doing the same work at the same "
              f"steps in the trace (other replica or TP peer): {names}")  # fmt: skip
    out = report.to_dict()
    if args.json_out != "-":
        print(f"{args.ops_trace}: {out['ranks']} ranks, {out['steps']} steps")
        keys = ["rank", "stage", "dp_rank", "speed", "first_step"]
        slow = [[e[k] for k in keys] for e in out["fail_slow"]]
        print("fail-slow (speed = its peers' compute time / its own):")
        print(table(slow, keys) if slow else "  none")
        heavy = [[e["stage"], e["ratio"]] for e in out["stage_imbalance"]]
        print("stage imbalance (ratio = stage's compute time / the median stage's, every replica):")
        print(table(heavy, ["stage", "ratio"]) if heavy else "  none")
    if args.json_out:
        write_json(out, args.json_out)
    return 0


def _parse_watch(text: str | None) -> tuple[float, int] | None:
    if text is None:
        return None
    try:
        factor, k = text.split(",")
        watch = (float(factor), int(k))
    except ValueError:
        raise ValueError(f"--watch {text!r}: must be FACTOR,K, e.g. 0.7,3") from None
    if not (0.0 < watch[0] < 1.0 and watch[1] >= 1):
        raise ValueError(f"--watch {text!r}: FACTOR must lie in (0, 1) and K be >= 1")
    return watch


def _print_detections(out: dict) -> None:
    rows = []
    for name, res in out["detectors"].items():
        first = res["alarms"][0] if res["alarms"] else None
        blame = res["reports"][0] if res["reports"] else None
        where = "-" if blame is None else str(blame.get("link") or blame["devices"])
        rows.append([name, len(res["alarms"]), first["detected_at"] if first else "-",
                     blame["kind"] if blame else "-", where,
                     f"{blame['severity']:.3f}" if blame else "-"])  # fmt: skip
    print(f"{out.get('scenario') or out.get('trace')}: {out['iterations']} iterations, "
          f"ITP MAPE {out['itp_mape_pct']}%")  # fmt: skip
    print(table(rows, ["detector", "alarms", "first at", "kind", "blamed", "severity"]))
    for r in out.get("localizer_alarms", []):
        print(f"localizer: {r['kind']} {r.get('link') or r['devices']} at iteration {r['iter']}, "
              f"factor {r['severity']:.3f}")  # fmt: skip


def _bench(args) -> int:
    from resihp.detect.bench import BenchConfig, run_bench

    def parse(text, conv, key):
        try:
            return tuple(conv(x) for x in text.split(",") if x)
        except ValueError:
            raise ValueError(f"--{key} {text!r}: must be a comma-separated list") from None

    cfg = BenchConfig(
        jobs=args.jobs,
        iters=args.iters,
        seed=BENCH_DEFAULTS["seed"] if args.seed is None else args.seed,
        seq_lens=parse(args.seq_lens, int, "seq-lens"),
        lengths=parse(args.lengths, str, "lengths"),
        faults=parse(args.faults, str, "faults"),
        burst_prob=args.burst_prob,
    )
    out = run_bench(cfg, _progress, workers=args.workers)
    if args.overhead:
        from resihp.detect.overhead import update_time

        out["overhead"] = [update_time(n) for n in (256, 16384)]
    rows = [[name, m["accuracy"], m["detection_rate"], m["false_alarms_per_job"], m["median_latency_iters"],
             m["localization_accuracy"], m["severity_within_10pct"]]
            for name, m in out["detectors"].items()]  # fmt: skip
    print(f"{cfg.jobs} jobs per setting, seed {cfg.seed}: MTP MAPE {out['mtp_mape_pct']}%, "
          f"ITP MAPE {out['itp_mape_pct']}%")  # fmt: skip
    print(table(rows, ["detector", "accuracy", "detected", "false/job", "median lat", "loc acc", "sev<=10%"]))
    if args.json_out:
        write_json(out, args.json_out)
    return 0
