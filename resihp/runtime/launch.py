"""Controller side of a local job: host the c10d TCPStore, spawn one worker process per device, collect.

The controller (the calling process) owns the `TCPStore` on 127.0.0.1 (free port), so no worker's
death takes the store down. Workers are `spawn`ed daemon processes; each joins the gloo world of
generation g through `PrefixStore(f"gen{g}", store)`, builds its `Groups`, runs its iterations and
streams one record per iteration back over a queue. Any worker error or death kills every child
and raises `RuntimeError` naming the device and carrying its traceback; on every exit path all
children are reaped (no orphans).
"""

from __future__ import annotations

import os
import queue as queue_mod
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from resihp.core.model_spec import ModelSpec
from resihp.core.plan import Plan
from resihp.core.workload import Workload
from resihp.model import gather_state

from .reference import OptimConfig

PG_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class JobSpec:
    """What every worker needs besides the Plan (picklable)."""

    spec: ModelSpec
    workload: Workload
    optim: OptimConfig = field(default_factory=OptimConfig)
    seed: int = 0
    iterations: int = 1
    start_iteration: int = 0
    timing: bool = True
    return_state: bool = False
    p2p: str = "root"  # "root" | "chunked": how SEND/RECV cross TP groups (worker.py)
    # (device, iteration): the worker exits hard (no message) before running that iteration —
    # the `stop` fault of the FaultSpec vocabulary, for tests of failure handling.
    stop_at: tuple[tuple[int, int], ...] = ()
    # Elastic runtime only (checkpoint.py): save the committed state every `checkpoint_every`
    # iterations into `checkpoint_dir`; `resume`: a checkpoint directory to start from (then
    # `start_iteration` is its iteration, and the optimizer step count is absolute).
    checkpoint_every: int = 0
    checkpoint_dir: str | None = None
    resume: str | None = None
    snapshots: bool = False  # keep a peer's committed shard in memory (snapshot.py)


class WorkerFailed(RuntimeError):
    """A worker raised or died; every child has been reaped when this propagates."""

    def __init__(self, message: str, devices: list[int], pids: list[int]) -> None:
        super().__init__(message)
        self.devices, self.pids = devices, pids


def _watch_controller(pid: int, period_s: float = 1.0) -> None:
    """Exit this worker at once when the controller process is gone (even SIGKILLed), so that no
    worker outlives it; polled from a daemon thread."""

    def watch() -> None:
        while True:
            time.sleep(period_s)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os._exit(3)

    threading.Thread(target=watch, name="controller-watchdog", daemon=True).start()


def exit_after(device: int, results, body) -> None:
    """Run a worker process's `body()`, report an exception to the controller with its traceback,
    flush the result queue and exit without interpreter teardown (torch's takes seconds)."""
    try:
        body()
        code = 0
    except BaseException:
        results.put(("error", device, traceback.format_exc()))
        code = 1
    results.close()
    results.join_thread()
    os._exit(code)


def _worker_main(plan: Plan, job: JobSpec, device: int, port: int, controller: int, results) -> None:
    """Entry point of one worker process."""
    _watch_controller(controller)

    def body() -> None:
        from .groups import build_groups, device_ranks
        from .worker import Worker

        torch.set_num_threads(1)
        ranks = device_ranks(plan)
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=PG_TIMEOUT_S))
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore(f"gen{plan.generation}", store),
            rank=ranks[device],
            world_size=len(ranks),
            timeout=timedelta(seconds=PG_TIMEOUT_S),
        )
        groups = build_groups(plan, device)
        worker = Worker(plan, device, groups, job)
        for it in range(job.start_iteration, job.start_iteration + job.iterations):
            if (device, it) in job.stop_at:
                results.close()
                results.join_thread()
                os._exit(1)
            results.put(("iter", device, worker.run_iteration(it)))
        if job.return_state:
            results.put(("state", device, worker.state_numpy()))
        groups.destroy()
        dist.destroy_process_group()
        results.put(("done", device, None))

    exit_after(device, results, body)


def _fail(by_dev: dict, done: set[int], errors: dict[int, str], results) -> None:
    """Raise WorkerFailed blaming, first, workers that died without a word (the likely root cause:
    their peers' collectives then fail with "connection closed"), then those that raised."""
    deadline = time.monotonic() + 1.0  # let the other consequences of one failure arrive
    while time.monotonic() < deadline:
        try:
            kind, dev, payload = results.get(timeout=0.1)
        except queue_mod.Empty:
            continue
        if kind == "error":
            errors[dev] = payload
    dead = [d for d, p in by_dev.items() if d not in done and d not in errors and p.exitcode not in (None, 0)]
    lines = [f"worker of device {d} died (exit code {by_dev[d].exitcode})" for d in dead]
    lines += [f"worker of device {d} failed:\n{tb}" for d, tb in sorted(errors.items())]
    pids = [p.pid for p in by_dev.values()]
    raise WorkerFailed("\n".join(lines), dead + sorted(errors), pids)


def _reap(procs: list) -> None:
    """Terminate, then kill, every child still alive; join them all."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 5.0
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def launch(
    plan: Plan,
    job: JobSpec,
    on_iteration: Callable[[int, list[dict]], None] | None = None,
) -> dict:
    """Run `job` under `plan` on one local process per device; returns {"records", "state"}.

    `records[it]` lists every device's trace record of iteration `it` (device order);
    `on_iteration(it, records)` is called as soon as all of them arrived. `state` (with
    `job.return_state`) maps replica -> full state dict gathered from that replica's shards.
    """
    devices = plan.devices()
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("forkserver")
    # Workers fork from a server that has already imported torch and the modules torch imports
    # lazily on the first forward/backward/optimizer step (torch._dynamo, sympy): start-up drops
    # from ~20 s to a few seconds for 8 workers on 2 cores.
    ctx.set_forkserver_preload(["resihp.runtime.worker", "torch._dynamo"])
    results = ctx.Queue()
    procs = []
    pending: dict[int, dict[int, dict]] = {}
    records: dict[int, list[dict]] = {}
    shards: dict[int, dict] = {}
    done: set[int] = set()
    try:
        for dev in devices:
            p = ctx.Process(
                target=_worker_main, args=(plan, job, dev, store.port, os.getpid(), results), daemon=True
            )
            p.start()
            procs.append(p)
        by_dev = dict(zip(devices, procs))
        while len(done) < len(devices):
            try:
                kind, dev, payload = results.get(timeout=0.5)
            except queue_mod.Empty:
                if any(d not in done and p.exitcode is not None for d, p in by_dev.items()):
                    _fail(by_dev, done, {}, results)
                continue
            if kind == "error":
                _fail(by_dev, done, {dev: payload}, results)
            if kind == "iter":
                got = pending.setdefault(payload["iter"], {})
                got[dev] = payload
                if len(got) == len(devices):
                    it = payload["iter"]
                    records[it] = [got[d] for d in devices]
                    del pending[it]
                    if on_iteration is not None:
                        on_iteration(it, records[it])
            elif kind == "state":
                shards[dev] = payload
            else:
                done.add(dev)
        for p in procs:
            p.join(10.0)
    finally:
        _reap(procs)
        results.close()
        del store
    state = _gather(plan, shards) if job.return_state else {}
    return {"records": records, "state": state, "pids": [p.pid for p in procs]}


def _gather(plan: Plan, shards: dict[int, dict]) -> dict[int, dict[str, torch.Tensor]]:
    """replica -> full state dict, from the TP shards of each of its (non-hollow) stages."""
    out: dict[int, dict[str, torch.Tensor]] = {}
    for d, stages in enumerate(plan.replicas):
        full: dict[str, torch.Tensor] = {}
        for st in stages:
            if st.hollow:
                continue
            pieces = [{n: torch.from_numpy(a) for n, a in shards[dev].items()} for dev in st.devices]
            full.update(gather_state(plan.model, pieces, st.tp_split, st.ffn_split, "copy"))
        out[d] = full
    return out


def alive(pids: list[int]) -> list[int]:
    """The subset of `pids` still running (not exited, not zombie); tests assert it is empty."""
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            out.append(pid)
    return out
