"""Bar charts like the paper's Table 6 / Fig. 9 / Fig. 10 from benchmarks/run_paper.py's JSON.

    python scripts/plot_results.py [RESULTS_DIR] [OUT_DIR]     # default results/paper docs/figures

table6.png: throughput / fault-free per model and fail-stop frequency (aborts drawn as "x");
fig9.png: throughput / unmitigated per model and severity; fig10.png: throughput / ReCycle per
model and frequency; fig14.png: the large-scale timeline.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from paper_numbers import FREQS, MODELS  # noqa: E402

from resihp.sim.plot import plot_timeline  # noqa: E402

FAMILIES = {
    "table6": ("stop", FREQS, None, ["oobleck", "recycle", "resihp-paper", "resihp"]),
    "fig9": ("slow", ("W", "M", "S"), "none", ["adaptra", "greyhound", "resihp-paper", "resihp"]),
    "fig10": (
        "mixed",
        FREQS,
        "recycle",
        ["recycle+greyhound", "oobleck+greyhound", "resihp-paper", "resihp"],
    ),
}


def bars(results: Path, family: str, out: Path) -> None:
    tag, cases, denom, policies = FAMILIES[family]
    fig, axes = plt.subplots(1, len(MODELS), figsize=(18, 3.6), sharey=True)
    width = 0.8 / len(policies)
    for ax, model in zip(axes, MODELS):
        for k, case in enumerate(cases):
            path = results / family / f"{model}-{tag}-{case}.json"
            if not path.exists():
                continue
            run = json.loads(path.read_text())
            base = (
                run["fault_free_samples_per_s"] if denom is None else run["policies"][denom]["samples_per_s"]
            )
            for j, name in enumerate(policies):
                p = run["policies"].get(name, {})
                x = k + (j - (len(policies) - 1) / 2) * width
                if "samples_per_s" not in p:
                    continue
                if p["aborted"]:
                    ax.plot(x, 0.05, "kx")
                    continue
                ax.bar(x, p["samples_per_s"] / base, width, color=f"C{j}", label=name if k == 0 else None)
        ax.set_xticks(range(len(cases)), cases)
        ax.set_title(model, fontsize=9)
        ax.axhline(1.0, color="grey", linewidth=0.6)
    axes[0].set_ylabel(f"throughput / {denom or 'fault-free'}")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / f"{family}.png", dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> None:
    results = Path(argv[0]) if argv else ROOT / "results" / "paper"
    out = Path(argv[1]) if len(argv) > 1 else ROOT / "docs" / "figures"
    out.mkdir(parents=True, exist_ok=True)
    for family in FAMILIES:
        bars(results, family, out)
    big = results / "fig14" / "llama2-70b-large.json"
    if big.exists():
        plot_timeline(json.loads(big.read_text()), str(out / "fig14.png"))
    print(f"wrote figures to {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
