"""The `state-transfer` event of a generation, from its members' `Joined` messages. Torch-free.

Times are the slowest member's (`group_s`: rendezvous and group building, `transfer_s`: the
state transfer). Bytes are measured: `bytes_moved` sums what every member received from others,
`max_received_bytes` is the most one member received, `received_bytes` each receiver's (device
-> bytes, receivers only); `lower_bound_bytes` and
`planned_bytes_moved` are the transfer plan's (`core.transfer_plan`, computed alike by every
member), so a run shows the planner's figures and the measured ones side by side.
"""

from __future__ import annotations


def transfer_event(it: int, generation: int, joined: list) -> dict:
    """The event once every member of `generation` joined (`joined`: their `Joined` messages)."""
    planned = next((m.planned for m in joined if m.planned is not None), None) or {}
    return {
        "iter": it,
        "kind": "state-transfer",
        "generation": generation,
        "group_s": max(m.group_s for m in joined),
        "transfer_s": max(m.transfer_s for m in joined),
        "bytes_moved": sum(m.received_bytes for m in joined),
        "max_received_bytes": max((m.received_bytes for m in joined), default=0),
        "received_bytes": {
            str(m.device): m.received_bytes
            for m in sorted(joined, key=lambda m: m.device)
            if m.received_bytes
        },
        "lower_bound_bytes": planned.get("lower_bound_bytes", 0),
        "planned_bytes_moved": planned.get("bytes_moved", 0),
    }
