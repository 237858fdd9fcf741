"""A `resihp train` run's events and plans in words: one source for the live lines on the terminal
(`runtime/live.py`) and for `resihp report` (`cli/report_cmd.py`).

Plans are read in their JSON form (`Plan.to_dict`), events as the runtime makes them
(docs/runtime.md, "Events"). Torch-free.
"""

from __future__ import annotations

RECOVERY_PARTS = ("detect_s", "quiesce_s", "plan_s", "teardown_s", "group_s", "transfer_s", "build_s")


def layout(plan: dict) -> str:
    """One line per Plan: `r0s0 [0, 1] L0-1 heads [4, 4]; ...` (standby devices at the end)."""
    parts = [
        f"r{d}s{i} {st['devices']} L{st['layers'][0]}-{st['layers'][1] - 1} heads {st['tp_split']}"
        for d, stages in enumerate(plan["replicas"])
        for i, st in enumerate(stages)
    ]
    if plan.get("standby"):
        parts.append(f"standby {plan['standby']}")
    return "; ".join(parts)


def plans_by_generation(run: dict) -> dict[int, dict]:
    """The run JSON's plans by generation (its `plans`, else its initial `plan` as generation 0)."""
    plans = {p.get("generation", g): p for g, p in enumerate(run.get("plans") or [])}
    if not plans and isinstance(run.get("plan"), dict):
        plans[0] = run["plan"]
    return plans


def device_count(plan: dict) -> int:
    """The devices that run a stage of `plan` (standby devices not counted)."""
    return sum(len(st["devices"]) for stages in plan["replicas"] for st in stages)


def changed_stages(plans: dict[int, dict], generation: int) -> str:
    """The stages of `generation`'s plan that differ from the plan before, in `layout` words ("" when
    either plan is unknown)."""
    if generation not in plans or generation - 1 not in plans:
        return ""
    before = set(layout(plans[generation - 1]).split("; "))
    return "; ".join(p for p in layout(plans[generation]).split("; ") if p not in before)


def died(ev: dict) -> str:
    """A `fail-stop` event as it happens: which device, and how the controller knew."""
    return f"device {ev.get('devices')} died ({ev.get('cause', '?')})"


def recovery_time(rec: dict) -> str:
    """A fail-stop's `recovery`: "0.62 s (detect 0.05, plan 0.01, ...)", kill -> first committed
    iteration and its parts."""
    parts = ", ".join(f"{k.removesuffix('_s')} {rec[k]:.2f}" for k in RECOVERY_PARTS if k in rec)
    return f"{rec['kill_to_commit_s']:.2f} s ({parts})"


def describe(ev: dict, plans: dict[int, dict] | None = None) -> str:
    """What one event did, in words; a replan names the stages that changed when `plans` (by
    generation) has its plan and the one before."""
    kind, where = ev["kind"], ev.get("link") or ev.get("devices")
    if kind.startswith("inject-"):
        fault = kind.removeprefix("inject-")
        text = f"injected {fault} of {where}"
        if ev.get("severity") is not None:
            text += f" at {ev['severity']:g}x"
        if ev.get("duration_s") is not None:
            text += f" for {ev['duration_s']:g} s"
        if ev.get("phase") or ev.get("hang"):
            text += f" (phase {ev.get('phase', 'start')}{', hang' if ev.get('hang') else ''})"
        return text
    if kind == "fail-stop":
        rec = ev.get("recovery")
        return f"{died(ev)}; {f'recovered in {recovery_time(rec)}' if rec else 'not recovered'}"
    if kind in ("fail-slow", "link-slow"):
        return f"{where} detected slow at {ev.get('severity', 0):.2f}x -> {ev.get('reason', '?')}"
    if kind == "recovered":  # a fail-slow device back at speed (the detector's report)
        return f"{where} back to speed -> {ev.get('reason', '?')}"
    if kind == "replan":
        n = len(ev.get("devices", []))
        text = f"generation {ev.get('generation')} on {n} devices ({ev.get('reason', '?')})"
        g = ev.get("generation")
        changes = changed_stages(plans or {}, g) if isinstance(g, int) else ""
        return f"{text}: {changes}" if changes else text
    if kind == "state-transfer":
        g, group_s, transfer_s = ev.get("generation"), ev.get("group_s", 0), ev.get("transfer_s", 0)
        return f"generation {g}: groups {group_s:.3f} s, transfer {transfer_s:.3f} s"
    if kind == "rejoin":
        return f"device {where} re-joined"
    if kind == "fault-end":
        return f"the {ev.get('fault')} fault of {where} ended after {ev.get('lasted_s', 0):.1f} s"
    if kind == "checkpoint":
        return f"wrote {ev.get('path')}"
    if kind == "restart":
        n, k = len(ev.get("devices", [])), ev.get("to_iter")
        return f"no live copy left: restarting from {ev.get('checkpoint')} (iteration {k}) on {n} devices"
    if kind == "snapshot-restore":
        k, back = ev.get("to_iter"), ev.get("to_iter", ev["iter"]) < ev["iter"]
        again = f" (rolled back: iteration {k} runs again)" if back else ""
        return f"state of lost devices {ev.get('lost')} restored from snapshots on {where}{again}"
    if kind == "job-failed":
        return f"the job stopped: {(str(ev.get('error', '')).splitlines() or ['?'])[0]}"
    if kind == "interrupted":
        return f"the job was stopped by {ev.get('signal', '?')}"
    rest = {k: v for k, v in ev.items() if k not in ("iter", "kind")}
    return ", ".join(f"{k} {v}" for k, v in rest.items()) or "-"
