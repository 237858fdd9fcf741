"""Throughput timelines per policy with fault markers (like the paper's Fig. 14); matplotlib Agg."""

from __future__ import annotations

MARKERS = {"stop": ("tab:red", "fail-stop"), "slow": ("tab:orange", "fail-slow"),
           "link": ("tab:purple", "link fail-slow"), "rejoin": ("tab:green", "re-join")}  # fmt: skip


def _runs(runs: dict) -> dict:
    """Accept `simulate_scenario`'s result or a plain {policy: run dict} mapping."""
    return runs["policies"] if "policies" in runs else runs


def plot_timeline(runs: dict, path: str, title: str | None = None) -> None:
    """Step plot of samples/s over hours for every policy that ran, faults as vertical lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = {n: r for n, r in _runs(runs).items() if "timeline" in r}
    if not policies:
        raise ValueError("plot_timeline: no policy with a timeline to draw")
    fig, ax = plt.subplots(figsize=(10, 4.5))
    end_h = runs.get("duration_s", 0.0) / 3600
    for name, run in policies.items():
        pts = run["timeline"]
        if not pts:
            continue
        xs = [t / 3600 for t, _ in pts]
        ys = [x for _, x in pts]
        if end_h > xs[-1]:  # the last rate holds until the run ends
            xs.append(end_h)
            ys.append(ys[-1])
        label = f"{name} ({run['samples_per_s']:.2f}{', aborted' if run['aborted'] else ''})"
        ax.step(xs + [None], ys + [None], where="post", label=label, linewidth=1.2)
    first = next(iter(policies.values()))
    seen = set()
    for ev in first["events"]:
        if ev["kind"] in MARKERS:
            color, label = MARKERS[ev["kind"]]
            ax.axvline(ev["t_s"] / 3600, color=color, alpha=0.35, linewidth=0.8,
                       label=None if label in seen else label)  # fmt: skip
            seen.add(label)
    ax.set_xlabel("time [h]")
    ax.set_ylabel("samples/s")
    ax.set_title(title or runs.get("scenario", "throughput timeline"))
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, loc="lower left", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
