"""A fault list turned into a checked, time-ordered trace of state changes of the true cluster.

The rules and their semantics are `resihp.core.faults` (the same for `resihp train --faults`):
`at_iter = k` means `at_s = k · t0`, t0 the fault-free iteration time, so every policy meets the
same physical fault at the same moment; a stop while a device is slow ends the slow (it re-joins
healthy); contradictory lists (a stop of a dead device, overlapping slow faults, ...) raise
ValueError naming the fault.
"""

from __future__ import annotations

from resihp.core.cluster import Cluster
from resihp.core.faults import Change, FaultSpec, check_faults, timeline

TraceEvent = Change  # one change of the true cluster: stop | slow | link | rejoin | slow-end | link-end


def build_trace(faults: tuple[FaultSpec, ...], cluster: Cluster, iteration_s: float) -> list[TraceEvent]:
    """The checked trace of `faults` on `cluster`; ValueError names the offending fault."""
    check_faults(faults, range(cluster.num_devices))
    return timeline(faults, iteration_s)
