"""`resihp report RUN.json [--plot OUT.png] [--json OUT]`: what happened to a `resihp train` run.

Reads the run JSON that `resihp train --json` writes (architecture §5.5; a failed run's too) and
prints: the losses, the throughput of each Plan generation (samples / iteration time over its
iterations; the run's iteration 0, which pays start-up, left out), every event with what it did,
the time each fail-stop's recovery took (the `recovery` field the controller puts on a fail-stop:
kill to the first committed iteration, and its parts), and the final layout. `--plot` draws loss and
samples/s over iterations with every event marked (`report_plot.py`); `--json` writes the summary.

A file that is not a run JSON (not JSON, no `iterations` / `events` lists, a row or event without
its keys) exits 2 with one line naming the file and what is missing.
"""

from __future__ import annotations

import json
from collections import Counter

from resihp.core.files import check_input, check_outputs
from resihp.core.run_events import describe, device_count, layout, plans_by_generation

from .common import table, write_json

NUMBER = (int, float)
ROW_KEYS = {"iter": int, "loss": NUMBER, "time_s": NUMBER, "samples": int, "generation": int}
EVENT_KEYS = {"iter": int, "kind": str}
_TYPE_NAMES = {int: "an integer", NUMBER: "a number", str: "a string"}
WHAT = "run file"
FAULT_EVENTS = ("fail-stop", "fail-slow", "link-slow", "rejoin")


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="summarize a `resihp train --json` run: losses, throughput, events")
    p.add_argument("run_file", metavar="RUN.json", help="the JSON written by `resihp train --json`")
    p.add_argument("--plot", help="write loss and samples/s over iterations, events marked, as a PNG")
    p.add_argument("--json", dest="json_out", help="write the summary as JSON ('-' for stdout)")
    p.set_defaults(run=run)


def _typed(value, kind) -> bool:
    return isinstance(value, kind) and not isinstance(value, bool)


def load_run(path: str) -> dict:
    """The run JSON at `path`, its rows and events checked; ValueError (one line) otherwise."""
    check_input(path, WHAT)
    with open(path, "rb") as fh:
        data = fh.read()
    try:
        run = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{WHAT} {path}: not UTF-8 text; give the JSON of `resihp train --json`") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{WHAT} {path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    for key in ("iterations", "events"):
        if not isinstance(run, dict) or not isinstance(run.get(key), list):
            raise ValueError(f"{WHAT} {path}: not a `resihp train --json` result (no {key!r} list)")
    for name, keys in (("iterations", ROW_KEYS), ("events", EVENT_KEYS)):
        for k, entry in enumerate(run[name]):
            for key, kind in keys.items():
                if not isinstance(entry, dict) or not _typed(entry.get(key), kind):
                    got = entry.get(key) if isinstance(entry, dict) else entry
                    raise ValueError(
                        f"{WHAT} {path}: {name}[{k}].{key} = {got!r}: missing or not {_TYPE_NAMES[kind]}"
                    )
    return run


def summarize(run: dict) -> dict:
    """The report of a checked run JSON (`load_run`), as JSON-ready data."""
    rows = run["iterations"]
    plans = plans_by_generation(run)
    gens: dict[int, list[dict]] = {}
    for r in rows:
        gens.setdefault(r["generation"], []).append(r)
    generations = []
    for g, rs in sorted(gens.items()):
        steady = [r for r in rs if r["iter"] > 0] or rs
        rate = sum(r["samples"] for r in steady) / max(sum(r["time_s"] for r in steady), 1e-9)
        generations.append({
            "generation": g, "first_iter": rs[0]["iter"], "last_iter": rs[-1]["iter"], "iterations": len(rs),
            "devices": device_count(plans[g]) if g in plans else None,
            "samples_per_s": round(rate, 3),
        })  # fmt: skip
    recoveries = [
        {"iter": ev["iter"], "devices": ev.get("devices"), "cause": ev.get("cause"),
         **{k: round(v, 4) for k, v in ev["recovery"].items()}}
        for ev in run["events"] if ev["kind"] == "fail-stop" and isinstance(ev.get("recovery"), dict)
    ]  # fmt: skip
    last = max(plans) if plans else None
    return {
        "iterations": len(rows),
        "first_loss": rows[0]["loss"] if rows else None,
        "final_loss": rows[-1]["loss"] if rows else None,
        "samples_per_s": (run.get("summary") or {}).get("samples_per_s"),
        "generations": generations,
        "event_counts": dict(sorted(Counter(ev["kind"] for ev in run["events"]).items())),
        "events": [
            {"iter": ev["iter"], "kind": ev["kind"], "what": describe(ev, plans)} for ev in run["events"]
        ],
        "recoveries": recoveries,
        "recovery_s": round(sum(r.get("kill_to_commit_s", 0.0) for r in recoveries), 4),
        "final_generation": last,
        "final_layout": layout(plans[last]) if last is not None else None,
    }


def print_report(path: str, rep: dict) -> None:
    loss = "no committed iteration"
    if rep["iterations"]:
        loss = f"loss {rep['first_loss']:.3f} -> {rep['final_loss']:.3f}"
    speed = f", {rep['samples_per_s']:.1f} samples/s" if rep["samples_per_s"] is not None else ""
    print(f"run {path}: {rep['iterations']} iterations, {loss}{speed}")
    rows = [[g["generation"], f"{g['first_iter']}-{g['last_iter']}", g["devices"] or "-", g["samples_per_s"]]
            for g in rep["generations"]]  # fmt: skip
    if rows:
        print(table(rows, ["generation", "iterations", "devices", "samples/s"]))
    counts = ", ".join(f"{k} {n}" for k, n in rep["event_counts"].items()) or "none"
    print(f"events: {counts}")
    width = max((len(e["kind"]) for e in rep["events"]), default=0)
    for e in rep["events"]:
        print(f"  iter {e['iter']:>4}  {e['kind']:<{width}}  {e['what']}")
    if rep["recoveries"]:
        print(f"time lost to fail-stop recoveries: {rep['recovery_s']:.2f} s over {len(rep['recoveries'])}")
    if rep["final_layout"] is not None:
        print(f"final layout (generation {rep['final_generation']}): {rep['final_layout']}")


def run(args) -> int:
    check_outputs({"--plot": args.plot, "--json": args.json_out}, stdout=("--json",))
    data = load_run(args.run_file)
    rep = summarize(data)
    print_report(args.run_file, rep)
    if args.json_out:
        write_json({"run": args.run_file, **rep}, args.json_out)
    if args.plot:
        from .report_plot import plot_run

        loss = f"loss {rep['first_loss']:.2f} -> {rep['final_loss']:.2f}; " if rep["iterations"] else ""
        faults = ", ".join(f"{rep['event_counts'][k]} {k}" for k in FAULT_EVENTS if k in rep["event_counts"])
        plot_run(
            data,
            args.plot,
            title=f"{args.run_file}: {rep['iterations']} iterations, {loss}{faults or 'no faults'}",
        )
        print(f"plot written to {args.plot}")
    return 0
