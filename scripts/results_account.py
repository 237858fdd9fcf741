"""docs/results.md sections on the loss account (issue 19), used by scripts/results_md.py.

- one table per family: for `resihp`, `resihp-paper` and the family's strongest baseline (highest
  mean fraction of the bound), the mean fraction of the capacity bound reached and the mean of
  each loss term (`lost` in `resihp simulate --json`, resihp/sim/account.py), then `resihp` per
  scenario; the paper's families from results/paper, ours (scenarios/extra) from results/extra;
- the evidence of scripts/loss_analysis.py (results/loss-analysis), when it was run;
- the paper's cells whose published figure exceeds our capacity bound;
- what the simulator charges for a plan change (resihp/sched/reconfig.py), from its constants.

The analysis of what remains is scripts/results_analysis.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from paper_numbers import FIG9, FIG10, FIG11, FREQS, MODELS, TABLE6  # noqa: E402

from resihp.core.transfer_plan import ELEMENT_BYTES, KINDS  # noqa: E402
from resihp.sched.baselines.common import OOBLECK_REINIT_S, PLANNING_S, RESTART_S  # noqa: E402
from resihp.sched.ours import ResiHP  # noqa: E402
from resihp.sched.reconfig import COMM_REBUILD_S, LAYER_FIXED_S, PAPER_PLANNING_S  # noqa: E402
from resihp.sim.account import CAUSES  # noqa: E402

PAPER_FAMILIES = ("table6", "fig9", "fig10", "fig14")
EXTRA_FAMILIES = ("lemon", "node", "burst")
TERMS = " | ".join(c.replace("_", " ") for c in CAUSES)


def _runs(folder: Path) -> dict[str, dict[str, dict]]:
    """scenario -> policy -> run, for the runs that carry an account."""
    out = {}
    for path in sorted(folder.glob("*.json")):
        pols = json.loads(path.read_text())["policies"]
        out[path.stem] = {
            n: p for n, p in pols.items() if "lost" in p and p["capacity_bound_samples_per_s"] > 0
        }
    return out


def _row(label: str, runs: list[dict]) -> str:
    n = len(runs)
    reached = sum(r["samples_per_s"] / r["capacity_bound_samples_per_s"] for r in runs) / n
    terms = " | ".join(f"{sum(r['lost'][c] for r in runs) / n:.4f}" for c in CAUSES)
    above = sum(r["above_bound"] for r in runs) / n
    aborted = sum(r["aborted"] for r in runs)
    return f"| {label} | {reached:.3f} | {terms} | {above:.4f} | {aborted} |"


def account_tables(results: Path, extra: Path) -> list[str]:
    lines = []
    for family, folder in [(f, results / f) for f in PAPER_FAMILIES] + [
        (f, extra / f) for f in EXTRA_FAMILIES
    ]:
        runs = _runs(folder)
        if not runs:
            continue
        names = {n for pols in runs.values() for n in pols}
        mean = {n: _mean_reach([p[n] for p in runs.values() if n in p]) for n in names}
        baselines = [n for n in names if not n.startswith("resihp")]
        strongest = max(baselines, key=lambda n: (mean[n], n)) if baselines else None
        rows = [n for n in ("resihp", "resihp-paper", strongest) if n in names]
        where = "scenarios/extra" if folder.parent == extra else "scenarios/paper"
        lines += [f"### {family} ({len(runs)} scenarios, {where}/{family})", ""]
        lines += [f"| policy | reached | {TERMS} | above bound | aborted |", "|---" * (len(CAUSES) + 4) + "|"]
        for n in rows:
            tag = " (strongest baseline)" if n == strongest else ""
            lines.append(_row(f"`{n}`{tag}", [p[n] for p in runs.values() if n in p]))
        lines += [f"| **`resihp` per scenario** |{' |' * (len(CAUSES) + 3)}"]
        lines += [_row(s, [p["resihp"]]) for s, p in runs.items() if "resihp" in p]
        lines.append("")
    return lines


def _mean_reach(runs: list[dict]) -> float:
    return sum(r["samples_per_s"] / r["capacity_bound_samples_per_s"] for r in runs) / len(runs)


def evidence(analysis: Path) -> list[str]:
    """Means per family of scripts/loss_analysis.py's JSON (shares of the bound's samples)."""
    keys = ("gap", "to_long_horizon", "to_reweighted", "to_best_known_scaled", "to_best_known")
    parts = ("planning_s", "rebuild_s", "bytes_s", "per_layer_s")
    rows = []
    for folder in sorted(p for p in analysis.glob("*/*") if p.is_dir()):
        outs = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
        if not outs:
            continue
        n = len(outs)
        steady = " | ".join(f"{sum(o['steady'][k] for o in outs) / n:.4f}" for k in keys)
        pause = " | ".join(f"{sum(o['pause_share'].get(k, 0.0) for o in outs) / n:.4f}" for k in parts)
        healthy = sum(o["best_regular_healthy"][0] / o["x0"] for o in outs) / n
        rows.append(f"| {folder.parent.name} | {folder.name} | {n} | {steady} | {pause} | {healthy:.3f} |")
    if not rows:
        return []
    head = (
        "| policy | family | scenarios | steady gap | to long horizon | to re-weighted "
        "| to best known (scaled) | to best known | pause: planning | rebuild | bytes | per layer "
        "| best regular healthy ÷ X0 |"
    )
    return [head, "|---" * (head.count("|") - 1) + "|", *rows, ""]


def _bound(run: dict | None, denom_policy: str | None) -> float | None:
    """Our capacity bound in the paper's ratio units (over `denom_policy`, or over fault-free)."""
    if run is None:
        return None
    pols = run["policies"]
    any_run = next(p for p in pols.values() if "capacity_bound_samples_per_s" in p)
    denom = run["fault_free_samples_per_s"] if denom_policy is None else pols[denom_policy]["samples_per_s"]
    return any_run["capacity_bound_samples_per_s"] / denom if denom > 0 else None


def _load(results: Path, family: str, name: str) -> dict | None:
    path = results / family / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def paper_cells_above_bound(results: Path) -> list[str]:
    """Published values (a range counts by its lower end) above our bound in the same units."""
    cells = []
    for m in MODELS:
        ff, *systems = TABLE6[m]
        for k, f in enumerate(FREQS):
            bound = _bound(_load(results, "table6", f"{m}-stop-{f}"), None)
            for name, values in zip(("Oobleck", "ReCycle", "ResiHP"), systems):
                if values[k] is not None:
                    cells.append((f"Table 6 {m} {f} {name}/fault-free", values[k] / ff, bound))
        for level in ("W", "M", "S"):
            bound = _bound(_load(results, "fig9", f"{m}-slow-{level}"), "none")
            for name, paper in FIG9[m][level].items():
                cells.append((f"Fig. 9 {m} {level} {name}/none", paper, bound))
        for f in FREQS:
            bound = _bound(_load(results, "fig10", f"{m}-mixed-{f}"), "recycle")
            for name, paper in FIG10[m][f].items():
                cells.append((f"Fig. 10 {m} {f} {name}/ReCycle", paper, bound))
    for (m, f), parts in FIG11.items():
        bound = _bound(_load(results, "fig11", f"{m}-mixed-{f}"), "recycle")
        cells.append((f"Fig. 11 {m} {f} resihp-paper[DE+LR+WM]/ReCycle", sum(parts), bound))
    run = _load(results, "fig14", "llama2-70b-large")
    for base, paper in (("recycle+greyhound", 1.39), ("oobleck+greyhound", 1.11)):
        cells.append((f"Fig. 14 ResiHP/{base}", paper, _bound(run, base) if run else None))
    rows = []
    for label, paper, bound in cells:
        lo = paper[0] if isinstance(paper, tuple) else paper
        if bound is not None and lo > bound * (1 + 1e-9):
            shown = f"{paper[0]:.2f}–{paper[1]:.2f}" if isinstance(paper, tuple) else f"{paper:.2f}"
            rows.append(f"| {label} | {shown} | {bound:.2f} |")
    if not rows:
        return ["No published cell exceeds our capacity bound.", ""]
    return ["| cell | paper | our capacity bound, same ratio |", "|---|---|---|", *rows, ""]


def reconfig_text() -> list[str]:
    return [
        "Every live plan change (`reconfig_cost`, resihp/sched/reconfig.py; restarts of checkpoint-restart "
        f"and Greyhound's S4 pause u0 = {RESTART_S:g} s plus the lost work instead) pauses training for",
        "",
        f"    planning + {COMM_REBUILD_S:g} s communicator rebuild (when any group changed) "
        "+ max over receiving devices of max(bytes from its node / B_intra, bytes from elsewhere / B_inter) "
        f"+ {LAYER_FIXED_S:g} s × the most layers moved into one group",
        "",
        "The bytes are the state-transfer planner's, the ones the runtime moves and `resihp plan --json` "
        "reports (resihp/core/transfer_plan.py; `core/transfer_volume.inflow` gives them per receiver "
        "without choosing among equally close senders): the rows of every tensor each device of the new "
        "plan does not hold "
        f"itself, {ELEMENT_BYTES * KINDS} bytes per parameter (fp32 parameter and both AdamW moments), "
        "from the closest live copy of the old plan (a device of its own node, then another node) or, "
        "when no live device holds them, the last completed iteration's persisted snapshot (over the "
        "inter-node bandwidth). Bytes from the receiver's node cross NVLink, the rest its NIC, the two "
        "in parallel; the planner spreads the parts over equally close senders, whose load is not priced. "
        "A layer is moved into a group when a member receives any of its tensors; the fixed "
        f"{LAYER_FIXED_S:g} s per layer (ResiHP Fig. 13: about 15 s for 10 layers) stays, as the paper "
        "measures it beyond the bytes. "
        f"Planning is {ResiHP().planning_s:g} s for `resihp` and "
        f"{PAPER_PLANNING_S:g} s for `resihp-paper` (ResiHP Fig. 13); ReCycle adds {PLANNING_S:g} s and "
        f"Oobleck {OOBLECK_REINIT_S:g} s of engine re-instantiation in its place (the account counts those "
        "as pause: only a policy's own `planning_s` is planning). Nothing of it overlaps training; the "
        "`pause: ...` columns above show what it amounts to.",
        "",
    ]
