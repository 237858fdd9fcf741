"""The real system: controller, node agents and workers on torch.distributed (gloo on CPU).

Layout by responsibility (docs/runtime.md, "Layout"): `control/` (controller, agents, members, their
protocol and transport), `exec/` (one device's groups, collectives, data and instruction list),
`state/` (transfer, snapshots, checkpoints), `adapt/` (fail-slow detection, calibration, replans);
beside them the job description (`job.py`), the train config (`config.py`), fault injection
(`faults.py`), `resihp train` (`train.py`) and the tests' single-process oracle (`reference.py`).

The entry points below are importable from here; they load on first use, so that importing a
torch-free submodule (a node agent imports `control.agent`) never pulls torch in.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "TrainConfig": "config",
    "run_training": "train",
    "launch_elastic": "control.controller",
    "JobSpec": "job",
    "OptimConfig": "job",
    "WorkerFailed": "job",
    "Interrupted": "job",
    "load_faults": "faults",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
