"""The picture of a `resihp train` run (`resihp report --plot`): loss and samples/s over iterations,
Plan generations as shaded bands, every event marked; matplotlib Agg.

Three panels share the iteration axis: the loss; samples/s per iteration (samples / the slowest
device's iteration time; thin) with its rolling median over 5 iterations (thick); and an event
strip with one row per event kind, one marker per event (injected faults hollow, with a bar while
the fault holds; what the runtime did filled), so that events at one iteration stay apart.
Failures, detections and re-joins also draw a labelled vertical line through the two upper panels;
a replan starts a new generation band.
"""

from __future__ import annotations

import statistics

# event kind -> (colour, line style through the panels or None: strip only, legend label)
STYLE = {
    "fail-stop": ("tab:red", "-", "fail-stop (device died)"),
    "fail-slow": ("tab:orange", "-", "fail-slow detected"),
    "link-slow": ("tab:purple", "-", "link-slow detected"),
    "rejoin": ("tab:green", "-", "re-join"),
    "replan": ("tab:blue", None, "replan"),  # the generation bands start there
    "checkpoint": ("tab:gray", None, "checkpoint"),
    "state-transfer": ("tab:cyan", None, "state transfer"),
}
INJECTED = {"inject-stop": "tab:red", "inject-slow": "tab:orange", "inject-link": "tab:purple",
            "inject-rejoin": "tab:green"}  # fmt: skip


def _rolling_median(values: list[float], window: int = 5) -> list[float]:
    half = window // 2
    return [statistics.median(values[max(0, k - half) : k + half + 1]) for k in range(len(values))]


def _until(ev: dict, events: list[dict], end: int) -> int:
    """Where an injected stop, slow or link fault stops holding: the device's re-join, the fault's
    end (`fault-end`), or the run's last iteration."""
    kind = ev["kind"].removeprefix("inject-")
    for later in events:
        if later["iter"] <= ev["iter"] or later.get("devices") != ev.get("devices"):
            continue
        if kind == "stop" and later["kind"] == "rejoin":
            return later["iter"]
        if later["kind"] == "fault-end" and later.get("fault") == kind:
            return later["iter"]
    return end


def plot_run(run: dict, path: str, title: str | None = None) -> None:
    """Draw the checked run JSON `run` (`report_cmd.load_run`) into the PNG `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, events = run["iterations"], run["events"]
    fig, (ax_loss, ax_sps, ax_ev) = plt.subplots(
        3, 1, figsize=(11, 7.5), sharex=True, gridspec_kw={"height_ratios": [3, 3, 2]}
    )
    its = [r["iter"] for r in rows]
    sps = [r["samples"] / max(r["time_s"], 1e-9) for r in rows]
    ax_loss.plot(its, [r["loss"] for r in rows], color="black", linewidth=1.3, marker=".", markersize=4)
    ax_sps.plot(its, sps, color="0.55", linewidth=0.8, label="per iteration")
    if rows:
        ax_sps.plot(its, _rolling_median(sps), color="black", linewidth=1.8, label="rolling median (5)")
    # generations: alternating bands, labelled at the top of the loss panel
    spans: dict[int, list[int]] = {}
    for r in rows:
        spans.setdefault(r["generation"], []).append(r["iter"])
    for n, (g, ks) in enumerate(sorted(spans.items())):
        lo, hi = min(ks) - 0.5, max(ks) + 0.5
        for ax in (ax_loss, ax_sps, ax_ev):
            ax.axvspan(lo, hi, color="0.93" if n % 2 else "white", zorder=0)
        ax_loss.text((lo + hi) / 2, 1.01, f"gen {g}", transform=ax_loss.get_xaxis_transform(),
                     ha="center", va="bottom", fontsize=8, color="0.3")  # fmt: skip
    order = sorted(events, key=lambda e: not e["kind"].startswith("inject-"))  # causes on top
    kinds = list(dict.fromkeys(e["kind"] for e in order))
    end = max([*its, *(e["iter"] for e in events)], default=0)
    seen: set[str] = set()
    for ev in events:
        kind, x = ev["kind"], ev["iter"]
        y = kinds.index(kind)
        if kind in INJECTED:
            if kind != "inject-rejoin":  # a bar while the fault holds
                ax_ev.plot(
                    [x, _until(ev, events, end)], [y, y], color=INJECTED[kind], linewidth=3, alpha=0.35
                )
            ax_ev.scatter([x], [y], marker="D", s=36, facecolors="white", edgecolors=INJECTED[kind],
                          linewidths=1.5, zorder=3)  # fmt: skip
            continue
        colour, line, label = STYLE.get(kind, ("0.4", None, kind))
        ax_ev.scatter([x], [y], marker="o", s=40, color=colour, zorder=3)
        if line is None:
            continue
        for ax in (ax_loss, ax_sps):
            ax.axvline(x, color=colour, linestyle=line, linewidth=1.4, alpha=0.8,
                       label=label if ax is ax_loss and label not in seen else None)  # fmt: skip
        seen.add(label)
        what = (
            f"link {ev['link']}" if ev.get("link") else f"device {', '.join(map(str, ev.get('devices', [])))}"
        )
        if kind in ("fail-slow", "link-slow"):
            what += f" at {ev['severity']:.2f}x"
        ax_sps.annotate(what, (x, 0), xytext=(3, 4), textcoords="offset points",
                        fontsize=7, color=colour, rotation=90, va="bottom")  # fmt: skip
    ax_ev.set_yticks(range(len(kinds)), kinds, fontsize=8)
    ax_ev.set_ylim(-0.7, len(kinds) - 0.3)
    ax_ev.invert_yaxis()
    ax_ev.grid(axis="y", color="0.85", linewidth=0.6)
    ax_ev.set_xlabel("iteration")
    ax_ev.set_title("events: hollow = fault injected (bar: while it holds), filled = what the runtime did",
                    fontsize=8, loc="left")  # fmt: skip
    ax_ev.set_xlim(min(its, default=0) - 0.5, end + 0.5)
    ax_loss.set_ylabel("loss")
    ax_sps.set_ylabel("samples/s")
    ax_sps.set_ylim(bottom=0)
    ax_sps.legend(fontsize=8, loc="lower right")
    if seen:
        ax_loss.legend(fontsize=8, loc="upper right")
    fig.suptitle(title or "resihp train run", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
