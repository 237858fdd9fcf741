"""Run the paper's scenario library (scenarios/paper/) and write one JSON per scenario.

    python benchmarks/run_paper.py [--family table6 fig9 ...] [--out results/paper] [--seed 0]
                                   [--jobs 8] [--policies none recycle ...]
    python benchmarks/run_paper.py --scenarios scenarios/extra --family lemon node burst --out results/extra

Each family runs the policies the paper compares in it (plus ours); `--policies` overrides (a
name that is not registered is an error). The Fig. 11 ablation runs `resihp-paper` with
components switched on one at a time (its `components` option).
"""

from __future__ import annotations

import argparse
import sys
import time
from multiprocessing import Pool
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from resihp.core.scenario import load_scenario  # noqa: E402
from resihp.sched import build_policy  # noqa: E402
from resihp.sim.compare import dumps, simulate_scenario  # noqa: E402

FAMILIES = {
    "table6": ["checkpoint-restart", "oobleck", "recycle", "resihp-paper", "resihp"],
    "fig9": ["none", "adaptra", "greyhound", "resihp-paper", "resihp"],
    "fig10": ["recycle", "recycle+greyhound", "oobleck+greyhound", "resihp-paper", "resihp"],
    "fig11": ["recycle", "resihp-paper[DE]", "resihp-paper[DE+LR]", "resihp-paper[DE+LR+WM]", "resihp"],
    "fig14": [
        "none", "checkpoint-restart", "recycle", "oobleck", "greyhound", "adaptra",
        "recycle+greyhound", "oobleck+greyhound", "resihp-paper", "resihp",
    ],
}  # fmt: skip
# Families outside the paper (scripts/make_extra_scenarios.py, under scenarios/extra/).
EXTRA = [
    "checkpoint-restart", "recycle", "oobleck", "greyhound", "oobleck+greyhound", "resihp-paper", "resihp",
]  # fmt: skip
FAMILIES.update({"lemon": EXTRA, "node": EXTRA, "burst": EXTRA})


def ablation(scenario, names: list[str], seed: int) -> dict:
    """Fig. 11: `resihp-paper[DE+LR]` = resihp-paper with only those components."""
    from resihp.sim.job import simulate

    plain = [n for n in names if "[" not in n]
    out = simulate_scenario(scenario, plain, seed)
    for n in names:
        if "[" not in n:
            continue
        parts = n[n.index("[") + 1 : -1].split("+")
        run = simulate(scenario, build_policy(n[: n.index("[")], {"components": parts}), seed)
        out["policies"][n] = run.to_dict()
    out["policies"] = {n: out["policies"][n] for n in names}
    return out


def run_one(args) -> tuple[str, float]:
    path, family, names, seed, out_dir = args
    t = time.time()
    scenario = load_scenario(str(path))
    result = (
        ablation(scenario, names, seed) if family == "fig11" else simulate_scenario(scenario, names, seed)
    )
    target = Path(out_dir) / family / (path.stem + ".json")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(dumps(result) + "\n")
    return f"{family}/{path.stem}", time.time() - t


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", nargs="*", default=list(FAMILIES), choices=list(FAMILIES))
    ap.add_argument("--scenarios", default=str(ROOT / "scenarios" / "paper"))
    ap.add_argument("--out", default=str(ROOT / "results" / "paper"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--policies", nargs="*", default=None)
    args = ap.parse_args(argv)
    tasks = []
    for family in args.family:
        names = args.policies or FAMILIES[family]
        for path in sorted(Path(args.scenarios, family).glob("*.toml")):
            tasks.append((path, family, names, args.seed, args.out))
    t0 = time.time()
    with Pool(max(1, args.jobs)) as pool:
        for name, dt in pool.imap_unordered(run_one, tasks):
            print(f"{name:40s} {dt:6.1f} s", flush=True)
    print(f"{len(tasks)} scenarios in {time.time() - t0:.1f} s -> {args.out}")


if __name__ == "__main__":
    main()
