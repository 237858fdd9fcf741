"""What `resihp train` checks before any process starts, beside the config's own keys
(`config.TrainConfig`): that a plan fits the workers and the machine, and every check of a run
that needs no torch (`check_run`: paths, the faults file under the one fault semantics).
`config` below is a `config.TrainConfig` (not imported: config.py imports this module).
Torch-free.
"""

from __future__ import annotations

import os

from resihp.core.faults import FaultSpec, check_faults
from resihp.core.files import check_dir, check_input, check_outputs
from resihp.core.plan import Plan

from .faults import load_faults
from .state.dirlock import check_free

MAX_WORKERS_PER_CORE = 16


def check_run(config, plan: Plan, start: int = 0) -> tuple[FaultSpec, ...]:
    """Every check of a run that needs no process and no torch, so that a bad input fails before
    anything starts: the plan fits the workers, the paths (`check_paths`) and the faults file
    (`core.faults.check_faults` on the plan's devices, iterations `[start, run.iterations)` and the
    link model of `run.link_mb_per_s`). Returns the checked faults."""
    check_fits(plan, config.workers, config.device)
    check_paths(config)
    faults = load_faults(config.faults) if config.faults else ()
    return check_faults(
        faults, plan.devices(), iterations=config.iterations, start=start, links=config.link_mb_per_s > 0
    )


def check_fits(plan: Plan, workers: int, device: str = "cpu") -> None:
    """ValueError when the plan needs more devices than `workers` or, on CPU, than the machine's cores
    can host (on CUDA the GPUs are the limit: `exec.device.check_cuda`, which needs torch)."""
    need = len(plan.devices())
    if need > workers:
        raise ValueError(f"the plan needs {need} devices but run.workers = {workers}")
    if device != "cpu":
        return
    cores = os.cpu_count() or 1
    if need > MAX_WORKERS_PER_CORE * cores:
        raise ValueError(
            f"the plan needs {need} worker processes; this machine has {cores} cores "
            f"(at most {MAX_WORKERS_PER_CORE * cores} workers)"
        )


def check_paths(config) -> None:
    """ValueError unless `run.faults` is a readable file, `run.trace` a writable place,
    `run.checkpoint_dir` a directory this run can fill and no live run holds (`dirlock`), and
    `data.path` a readable token file within the model's vocabulary."""
    if config.faults is not None:
        check_input(config.faults, "run.faults")
    check_outputs({"run.trace": config.trace})
    if config.checkpoint_dir is not None:
        check_dir(config.checkpoint_dir, "run.checkpoint_dir")
        check_free(config.checkpoint_dir, "run.checkpoint_dir")
    if config.data_path is not None:
        check_input(config.data_path, "data.path")
        config.tokens().check(config.spec.vocab, "data.path")
