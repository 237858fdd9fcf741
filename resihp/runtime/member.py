"""Worker side of the elastic runtime: generations, the commit protocol, abort, state transfer.

A member process loops over Plan generations. For generation g it joins the gloo world of the
generation's members (plan devices and standby workers, ranked in ascending id) through
`PrefixStore(f"gen{g}", store)`, builds its groups, receives its state (`transfer`), and runs
iterations. At STEP of iteration k it reports `reached` (with its losses) and blocks on the
controller's decision `decision/{g}/{k}` in the store:

* `commit`: apply the optimizer step, go on with k + 1;
* `next`: apply the step, then leave g for the Plan the controller published as `plan/{g+1}`;
* `abort`: a member died; skip the step (the state stays the one committed at k − 1) and join g+1.

A collective that fails because a peer died raises RuntimeError; the member reports `abort` and
leaves at once. Leaving drops every reference to the generation's process groups and destroys
them, which closes their sockets, so peers blocked on *this* member fail in turn — the failure
cascades through the world in milliseconds instead of waiting for gloo's timeout. A standby member
(in the world, not in the plan) only serves/receives state and waits for the next generation.
"""

from __future__ import annotations

import gc
import os
import pickle
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from .checkpoint import load_init, save_shard
from .faults import faults_at
from .groups import build_groups
from .launch import PG_TIMEOUT_S, _watch_controller, exit_after
from .snapshot import exchange, holders
from .transfer import holding_of, transfer
from .worker import Worker


class Aborted(Exception):
    """The controller aborted the iteration in flight."""


def plan_key(generation: int) -> str:
    return f"plan/{generation}"


def decision_key(generation: int, it: int) -> str:
    return f"decision/{generation}/{it}"


def member_main(msg: dict, job, faults, device: int, port: int, controller: int, results) -> None:
    """Process entry point; `msg` is the first generation's {"generation", "plan", "members", "start"}
    (+ "previous": the plan it replaces, for a member that re-joins a running job)."""
    _watch_controller(controller)

    def body() -> None:
        torch.set_num_threads(1)
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=PG_TIMEOUT_S))
        _run(msg, job, faults, device, store, results)

    exit_after(device, results, body)


def _run(msg: dict, job, faults, device: int, store, results) -> None:
    end = job.start_iteration + job.iterations
    old, holding = msg.get("previous"), None  # a re-joining member starts in generation g > 0
    teardown_s = 0.0  # leaving the previous generation: holding copy, group destruction
    first = msg["generation"]
    snaps: dict = {}  # snapshot.py: the committed shards this device keeps for its buddies
    while msg is not None:
        g, plan, it = msg["generation"], msg["plan"], msg["start"]
        ranks = {d: r for r, d in enumerate(sorted(msg["members"]))}
        t0 = time.perf_counter()
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore(f"gen{g}", store),
            rank=ranks[device],
            world_size=len(ranks),
            timeout=timedelta(seconds=PG_TIMEOUT_S),
        )
        groups = build_groups(plan, device, ranks)
        t1 = time.perf_counter()
        steps = it if job.resume else it - job.start_iteration  # committed optimizer steps
        if old is not None:
            hold = holders(old) if job.snapshots else None
            init = transfer(old, holding, plan, device, ranks, steps, snaps, hold)
        elif job.resume and g == first:  # a whole-job restart: state from the checkpoint
            init = load_init(job.resume, plan, device)
        else:
            init = None
        t2 = time.perf_counter()
        old = holding = None
        worker = None if plan.stage_of(device) is None else Worker(plan, device, groups, job, init)
        snaps = {}  # snapshots of the old plan are stale now; plan devices refresh them at once
        if worker is not None and job.snapshots:
            snaps.update(exchange(plan, device, ranks, holding_of(worker)))
        timing = {"group_s": t1 - t0, "transfer_s": t2 - t1, "build_s": time.perf_counter() - t2}
        results.put(("joined", device, {"generation": g, "teardown_s": teardown_s, **timing}))
        leave = (
            "standby"
            if worker is None
            else _iterate(worker, g, it, end, faults, store, results, ranks, snaps)
        )
        t_left = time.perf_counter()
        old = plan  # a standby member holds nothing but still takes part in the next transfer
        if leave in ("next", "abort"):
            holding = holding_of(worker)
        elif leave == "end" and job.return_state:
            results.put(("state", device, worker.state_numpy()))
        # Drop every reference to this generation's groups before destroying them: the sockets
        # close, and peers still blocked on this member fail at once (the abort cascade).
        worker = groups = init = None
        dist.destroy_process_group()
        gc.collect()
        teardown_s = time.perf_counter() - t_left
        if leave == "end":
            break
        msg = pickle.loads(store.get(plan_key(g + 1)))
    results.put(("done", device, None))


def _iterate(worker: Worker, g: int, it: int, end: int, faults, store, results, ranks, snaps: dict) -> str:
    """Run and commit iterations from `it`; returns why the generation ends: next | abort | end.
    With `job.snapshots`, `snaps` is refreshed after every committed step (`snapshot.exchange`)."""
    device, decision = worker.device, {}

    def before_step(k: int, losses: list, wall_s: float) -> None:
        results.put(("reached", device, {"generation": g, "iter": k, "losses": losses, "wall_s": wall_s}))
        verdict = store.get(decision_key(g, k)).decode()
        if verdict == "abort":
            raise Aborted(f"iteration {k} aborted by the controller")
        decision["verdict"] = verdict

    worker.before_step = before_step
    while it < end:
        stop, worker.slow, worker.link = faults_at(faults, device, it)
        if stop:  # the `stop` fault: exit hard, like a crashed process, after saying when
            results.put(("stopping", device, {"iter": it, "time": time.time()}))
            results.close()
            results.join_thread()
            os._exit(1)
        failed = None
        try:
            record = worker.run_iteration(it)
        except (RuntimeError, Aborted) as e:  # a peer died (gloo raises) or the controller aborted
            failed = f"{type(e).__name__}: {e}"[:300]
        if failed is not None:
            worker.opt.zero_grad(set_to_none=True)
            results.put(("abort", device, {"generation": g, "iter": it, "error": failed}))
            return "abort"
        results.put(("iter", device, record))
        it += 1
        every = worker.job.checkpoint_every
        if every and it % every == 0:  # the step of iteration it - 1 is committed: save it
            if save_shard(worker.job.checkpoint_dir, it, worker.plan, device, holding_of(worker)):
                results.put(("saved", device, {"generation": g, "iter": it}))
        if worker.job.snapshots:
            try:
                fresh = exchange(worker.plan, device, ranks, holding_of(worker))
            except RuntimeError as e:  # a peer died: never keep a stale snapshot as if current
                snaps.clear()
                results.put(("abort", device, {"generation": g, "iter": it, "error": f"snapshot: {e}"[:300]}))
                return "abort"
            snaps.clear()
            snaps.update(fresh)
        if decision.pop("verdict") == "next":
            return "next"
    return "end"
