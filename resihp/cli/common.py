"""Shared CLI plumbing: policy names, JSON writing and plain-text tables."""

from __future__ import annotations

import json
import sys

from resihp.core.files import write_atomic

POLICY_NAMES = (
    "none", "checkpoint-restart", "recycle", "oobleck", "greyhound", "adaptra",
    "recycle+greyhound", "oobleck+greyhound", "resihp-paper", "resihp",
)  # fmt: skip


def built_policies() -> dict:
    """Policy name -> class, for the policies that exist in this build."""
    try:
        from resihp.sched import POLICIES
    except ImportError:
        return {}
    return dict(POLICIES)


def check_policy(name: str) -> None:
    if name not in POLICY_NAMES:
        raise ValueError(f"--policy {name!r}: unknown; allowed: {', '.join(POLICY_NAMES)}")
    if name not in built_policies():
        built = ", ".join(p for p in POLICY_NAMES if p in built_policies()) or "none yet"
        raise ValueError(f"--policy {name!r}: not built yet; built: {built}")


def write_json(data: dict, path: str) -> None:
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    if path == "-":
        sys.stdout.write(text)
        return
    write_atomic(path, text)


def table(rows: list[list], header: list[str]) -> str:
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[k]) for r in cells) for k in range(len(header))]
    lines = [
        "  ".join(c.rjust(w) if k else c.ljust(w) for k, (c, w) in enumerate(zip(r, widths))) for r in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def gib(x: float) -> str:
    return f"{x / 2**30:.1f}"
