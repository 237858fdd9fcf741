"""How fast, and at what cost, each policy's detector reports what happened to the true cluster.

A policy never sees faults directly (baselines.md §0): the job simulator turns each change of the
true cluster into a FailureReport delivered after the detector's latency. A policy states its
detector with `Policy.detector(ctx) -> DetectorSpec`; the default is `resihp_detector` (paper.md
§3: heartbeats, confirmation within 2–3 iterations, Table 5 false alarms).
"""

from __future__ import annotations

from dataclasses import dataclass

HEARTBEAT_S = 3.0  # shared fail-stop detector: 1 s heartbeats, 3 misses (baselines.md §0)
HANG_S = 600.0  # hang detection without in-band detection (cost-model.md §8.2)


def table5_index(seq_len: int) -> int:
    """ResiHP Table 5 setting: 0 = small 8K, 1 = medium 16K, 2 = medium 32K (by sequence length)."""
    return 0 if seq_len <= 8192 else 1 if seq_len <= 16384 else 2


@dataclass(frozen=True)
class DetectorSpec:
    """Latencies (None = never detected) and the pauses detection itself costs."""

    stop_s: float | None = HEARTBEAT_S  # fail-stop (and re-join) seen after this many seconds
    slow_iters: float | None = None  # iterations until a compute fail-slow is confirmed
    link_iters: float | None = None  # iterations until a link fail-slow is localized
    extra_s: float = 0.0  # fixed delay added to fail-slow detection (manual detection)
    validation_pause_s: float = 0.0  # training pause per confirmed fail-slow (validation)
    false_alarms: float = 0.0  # expected false alarms per job (Poisson)
    false_alarm_pause_s: float = 0.0  # pause per false alarm


def resihp_detector(ctx) -> DetectorSpec:
    """ResiHP: heartbeats; fail-slows confirmed in 2–3 iterations; Table 5 false alarms."""
    k = table5_index(ctx.workload.seq_len)
    return DetectorSpec(
        HEARTBEAT_S, 2.5, 2.5, 0.0, (0.034, 0.045, 0.049)[k], (0.0, 0.1, 0.3)[k], (0.034, 0.045, 0.049)[k]
    )


def greyhound_detector(ctx) -> DetectorSpec:
    """Greyhound: 10-iteration persistence + one profiled iteration + validation pause (Table 5)."""
    k = table5_index(ctx.workload.seq_len)
    pause = (2.24, 3.28, 3.72)[k]
    return DetectorSpec(HEARTBEAT_S, 11.0, 11.0, 0.0, pause, (3.7, 5.2, 8.7)[k], pause)
