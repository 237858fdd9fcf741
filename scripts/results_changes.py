"""docs/results.md's "What changed since the previous generation of this file" (scripts/results_md.py).

    git show main:docs/results.md > /tmp/old.md      # the previous generation
    python scripts/results_md.py results/paper --previous /tmp/old.md --previous-results OLD/paper

Every comparison cell (a `| cell | paper | ours | ...` row under a `## <table>, ResiHP column =
...` heading, the Fig. 14 ratios, the fraction of the capacity bound per family and policy) whose
shown value differs from the previous file is listed, grouped by why it moved. The why is read off
the two generations' run JSON: for each policy a cell depends on (its numerator, and its
denominator: fault-free X0, `none` or `recycle`), whether its throughput moved by more than 0.05 %
and whether it took the same decisions (the same replan, escalate and abort reasons in the same
order). A policy that moved with the same decisions moved because the simulator prices its plans
differently (EVALUATION); one that decided differently moved for the reason REASONS gives for it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

# Why a policy's own decisions changed since the previous generation (by policy name; an
# ablation "resihp-paper[DE]" uses "resihp-paper"): (tag, text).
REASONS = {
    name: (
        "pause",
        (
            f"`{name}` weighs each candidate's pause, which now follows the state-transfer planner's bytes "
            "(sched/reconfig.py: 12 bytes per parameter of the rows each device lacks, over NVLink from its "
            "node and over the NIC from elsewhere, instead of 14 bytes per parameter of every layer shard "
            "moved, all over the inter-node bandwidth): some candidates' pauses moved and it chose another"
        ),
    )
    for name in ("resihp", "resihp-paper")
}
EVALUATION = (
    "pricing",
    (
        "the same decisions, priced anew: the pause of a plan change follows the state-transfer planner's "
        "bytes (sched/reconfig.py, core/transfer_volume.py) instead of 14 bytes per parameter of each moved "
        "layer shard over the inter-node bandwidth"
    ),
)
OTHER = {"X0": "the fault-free throughput X0 moved", "rounding": "the runs moved by under 0.05 %",
         "new": "no previous run"}  # fmt: skip
DENOMINATOR = {"table6": None, "fig9": "none", "fig10": "recycle", "fig11": "recycle", "fig14": None}
NAMES = {"Oobleck": "oobleck", "ReCycle": "recycle"}
TOL = 5e-4


def _cells(text: str) -> dict[tuple[str, str], str]:
    """(section, cell label) -> the value shown for ours."""
    out, section = {}, ""
    for line in text.splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
            continue
        parts = [p.strip() for p in line.strip().strip("|").split("|")]
        if (
            not line.startswith("| ")
            or len(parts) < 3
            or parts[0] in ("cell", "ratio", "family")
            or set(parts[0]) <= {"-"}
        ):
            continue
        if "ResiHP column" in section:
            out[(section, parts[0])] = parts[2]
        elif section.startswith("Fig. 14"):
            out[(section, parts[0])] = " / ".join(parts[2:4])
        elif section.startswith("Throughput as a fraction"):
            out[(section, f"{parts[0]} {parts[1]}")] = parts[2]
    return out


def _decisions(run: dict) -> list:
    return [
        (e["kind"], e.get("reason")) for e in run["events"] if e["kind"] in ("replan", "escalate", "abort")
    ]


def _why(family: str, scenario: str, policy: str, old: Path, new: Path) -> list[str]:
    """The reasons the run (family, scenario, policy) moved; [] if it did not."""
    try:
        a = json.loads((old / family / f"{scenario}.json").read_text())
        b = json.loads((new / family / f"{scenario}.json").read_text())
    except FileNotFoundError:
        return ["new"]
    if policy is None:  # fault-free X0
        x, y = a["fault_free_samples_per_s"], b["fault_free_samples_per_s"]
        return [] if abs(y / x - 1) <= TOL else ["X0"]
    ra, rb = a["policies"].get(policy), b["policies"].get(policy)
    if ra is None or rb is None:
        return ["new"]
    x, y = ra["samples_per_s"], rb["samples_per_s"]
    if ra["aborted"] == rb["aborted"] and (abs(y / x - 1) <= TOL if x > 0 else y == 0):
        return []
    if _decisions(ra) == _decisions(rb):
        return [EVALUATION[0]]
    return [
        REASONS[policy.split("[")[0]][0] if policy.split("[")[0] in REASONS else f"`{policy}` decided anew"
    ]


def _policies(section: str, label: str) -> tuple[str, list[tuple[str, str, str | None]]]:
    """(family, [(family, scenario, policy or None for X0)]) a cell depends on."""
    column = re.search(r"`([^`]+)`", section).group(1) if "`" in section else "resihp"
    words = label.split()
    if section.startswith("Table 6"):
        m, f, ratio = words
        name = ratio.split("/")[0]
        pol = NAMES.get(name, column)
        return "table6", [("table6", f"{m}-stop-{f}", pol), ("table6", f"{m}-stop-{f}", None)]
    if section.startswith("Fig. 9"):
        m, level, ratio = words
        name = ratio.split("/")[0]
        pol = column if name == "resihp-paper" else name
        return "fig9", [("fig9", f"{m}-slow-{level}", pol), ("fig9", f"{m}-slow-{level}", "none")]
    if section.startswith("Fig. 10") or section.startswith("Fig. 11"):
        fam = "fig10" if section.startswith("Fig. 10") else "fig11"
        m, f, ratio = words
        name = ratio.split("/")[0]
        pol = column if name == "resihp-paper" and fam == "fig10" else name
        return fam, [(fam, f"{m}-mixed-{f}", pol), (fam, f"{m}-mixed-{f}", "recycle")]
    if section.startswith("Fig. 14"):
        base = label.split("/")[-1].strip()
        deps = [("fig14", "llama2-70b-large", p) for p in ("resihp-paper", "resihp", base)]
        return "fig14", deps
    family, policy = words
    return family, [(family, "*", policy)]


def changes(old_md: str, new_md: str, old: Path, new: Path) -> list[str]:
    """The section's lines: a legend of the reasons, then one row per moved cell."""
    before, after = _cells(old_md), _cells(new_md)
    rows, used = [], []
    for key in sorted(after, key=list(after).index):
        if key not in before or before[key] == after[key]:
            continue
        section, label = key
        _, deps = _policies(section, label)
        tags: list[str] = []
        for fam, scenario, pol in deps:
            every = [p.stem for p in sorted((new / fam).glob("*.json"))]
            for s in every if scenario == "*" else [scenario]:
                tags += [t for t in _why(fam, s, pol, old, new) if t not in tags]
        tags = tags or ["rounding"]
        used += [t for t in tags if t not in used]
        table = section.split(":")[0]
        column = re.search(r"`([^`]+)`", section).group(1) if "ResiHP column" in section else ""
        where = f"{table} [`{column}`]" if column else table
        rows.append(f"| {where} | {label} | {before[key]} | {after[key]} | {', '.join(tags)} |")
    if not rows:
        return ["No cell moved."]
    texts = {tag: text for tag, text in (*REASONS.values(), EVALUATION)} | OTHER
    legend = [f"- `{t}`: {texts.get(t, t)}" for t in used]
    head = ["| table [ResiHP column] | cell | previous | now | why |", "|---|---|---|---|---|"]
    return [f"{len(rows)} cells moved. Why (per policy the cell depends on):", "", *legend, "", *head, *rows]
