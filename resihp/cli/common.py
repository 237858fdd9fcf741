"""Shared CLI plumbing: the policy-name check, JSON writing and plain-text tables."""

from __future__ import annotations

import json
import sys

from resihp.core.files import write_atomic
from resihp.sched.registry import POLICIES


def check_policy(name: str) -> None:
    """ValueError unless `name` is registered (`resihp.sched.registry.POLICIES`)."""
    if name not in POLICIES:
        raise ValueError(f"--policy {name!r}: unknown; allowed: {', '.join(POLICIES)}")


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
