"""Worker side of the elastic runtime: generations, the commit protocol, abort, state transfer.

A member process loops over Plan generations. For generation g it joins the gloo world of the
generation's members (plan devices and standby workers, ranked in ascending id) through
`PrefixStore(f"gen{g}", store)`, builds its groups, receives its state (`transfer`), and runs
iterations. At STEP of iteration k it reports `reached` (with its losses) and blocks on the
controller's decision `decision/{g}/{k}` in the store:

* `commit`: apply the optimizer step, go on with k + 1;
* `next`: apply the step, then leave g for the Plan the controller published as `plan/{g+1}`;
* `abort`: a member died; skip the step (the state stays the one committed at k − 1) and join g+1.

`commit+faults` / `next+faults`: the same, once the member replaced its faults with those of the
store key `faults/{g}/{k}` (the controller resolved time-keyed faults or fault ends at this commit:
`faults.TimedFaults`); every message of a generation (`plan/{g}`) carries them too.

Joining g: the member reports `joining` and waits on the store key `go/{g}` (`liveness.JoinBarrier`):
the controller writes `go` once every member of g arrived, or `abort` when a member died first, so a
death between generations never reaches gloo. After `go` the rendezvous and group building run
with a short timeout (`JOIN_TIMEOUT_S`); a join that fails there or in the state transfer (a peer
died or hung during the rebuild: gloo raises, at once for a closed socket) is torn down like a
generation, reported as `abort`, and the member waits for g+1. A member keeps the state it held
when it left each generation it joined (`held`), so g+1 can transfer from the last generation every
survivor joined (the message's `source`), even when g itself never ran an iteration.

A member is spawned by its node's agent (`agent.py`) and exits when that agent is gone. It beats: a
daemon thread puts ("heartbeat", device, ...) on the agent's queue every `HEARTBEAT_S` (`Heartbeat`),
whatever the main thread waits for, and the agent forwards the beats to the controller; a frozen
process goes silent and the controller has its agent kill it (`liveness.Liveness`). Every other
message goes straight to the controller's results queue.

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
import signal
import threading
import time
import traceback
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from ..exec.groups import build_groups
from ..exec.worker import Worker
from ..faults import faults_at, join_stop
from ..state.checkpoint import load_init, save_shard
from ..state.snapshot import exchange, holders
from ..state.transfer import holding_of, transfer
from .liveness import HEARTBEAT_S, go_key
from .pids import watch

PG_TIMEOUT_S = 120.0  # gloo operations and store waits; heartbeats, far shorter, decide first
JOIN_TIMEOUT_S = 10.0  # rendezvous + group building of a generation, once every member is at `go`


class Aborted(Exception):
    """The controller aborted the iteration in flight."""


def plan_key(generation: int) -> str:
    return f"plan/{generation}"


def decision_key(generation: int, it: int) -> str:
    return f"decision/{generation}/{it}"


def faults_key(generation: int, it: int) -> str:
    return f"faults/{generation}/{it}"


def member_main(blob: bytes, beats, results, agent: int) -> None:
    """Process entry point (spawned by the agent process `agent`); `blob` pickles (msg, job, faults,
    device, store port), `msg` being the first generation's {"generation", "plan", "members",
    "start", "source", "faults"} (a member that re-joins a running job starts in generation g > 0; it holds
    nothing of `source` but takes part in its transfer). `beats`: the agent's heartbeat queue."""
    msg, job, faults, device, port = pickle.loads(blob)
    watch(agent, lambda: os._exit(3))  # a dead agent (a dead node) takes its members down
    # The modules preloaded by the forkserver (torch, ...) are millions of objects: a full
    # collection over them holds the GIL for 0.1-1 s, which silences the heartbeat thread; frozen,
    # they are never scanned, and `gc.collect()` at a generation change takes milliseconds.
    gc.freeze()
    heart = Heartbeat(device, beats)

    def body() -> None:
        torch.set_num_threads(1)
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=PG_TIMEOUT_S))
        _run(msg, job, faults, device, store, results, heart)

    exit_after(device, results, body, heart.stop)


def exit_after(device: int, results, body, before_exit: Callable[[], None] | None = None) -> None:
    """Run a worker process's `body()`, report an exception to the controller with its traceback,
    call `before_exit` (the heartbeat's stop), flush the result queue and exit without interpreter
    teardown (torch's takes seconds)."""
    try:
        body()
        code = 0
    except BaseException:
        results.put(("error", device, traceback.format_exc()))
        code = 1
    if before_exit is not None:
        before_exit()
    results.close()
    results.join_thread()
    os._exit(code)


class Heartbeat:
    """A daemon thread that puts ("heartbeat", device, {"time", "pid"}) on the agent's queue `beats`
    every `period_s` until `stop`."""

    def __init__(self, device: int, beats, period_s: float = HEARTBEAT_S) -> None:
        self.beats, self.quiet = beats, threading.Event()

        def beat() -> None:
            while not self.quiet.is_set():
                try:
                    beats.put(("heartbeat", device, {"time": time.time(), "pid": os.getpid()}))
                except (ValueError, OSError):  # closed
                    return
                self.quiet.wait(period_s)

        self.thread = threading.Thread(target=beat, name="heartbeat", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Silence the thread and flush the queue: a process that then exits or freezes holds no lock
        of the agent's queue (killed or frozen mid-write, it would silence its whole node)."""
        self.quiet.set()
        self.thread.join(1.0)
        self.beats.close()
        self.beats.join_thread()


def _wait_key(store, key: str) -> bytes:
    """The value of `key` once the controller writes it, however long that takes (a standby member
    may wait a whole run for the next generation); the agent watchdog ends an orphan."""
    while True:
        try:
            store.wait([key], timedelta(seconds=PG_TIMEOUT_S))
            return store.get(key)
        except dist.DistStoreError:
            continue


def _teardown() -> None:
    """Destroy this generation's default group (the caller dropped every reference to its groups,
    so their sockets close now and peers still blocked on this member fail at once)."""
    if dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()


def _run(msg: dict, job, faults, device: int, store, results, heart: Heartbeat) -> None:
    end = job.start_iteration + job.iterations
    # generation -> (Holding or None, snapshots): the committed state this member left it with
    held: dict[int, tuple] = {}
    teardown_s = 0.0  # leaving the previous generation: holding copy, group destruction
    faults = list(faults)  # every fault resolved so far (iteration-keyed), updated in place
    while msg is not None:
        g, plan, it = msg["generation"], msg["plan"], msg["start"]
        faults[:] = msg.get("faults", faults)
        source = msg["source"]  # (generation, plan) whose held state g starts from; None: seed/checkpoint
        for k in [k for k in held if source is None or k < source[0]]:
            del held[k]  # never a transfer source again (`recovery.source_generation` is monotone)
        results.put(("joining", device, {"generation": g}))
        if _wait_key(store, go_key(g)).decode() == "abort":  # superseded before its rendezvous
            msg = pickle.loads(_wait_key(store, plan_key(g + 1)))
            continue
        ranks = {d: r for r, d in enumerate(sorted(msg["members"]))}
        worker = groups = init = None
        snaps: dict = {}  # snapshot.py: the committed shards this device keeps for its buddies
        failed = None
        t0 = time.perf_counter()
        try:
            short = timedelta(seconds=JOIN_TIMEOUT_S)
            dist.init_process_group(
                "gloo",
                store=dist.PrefixStore(f"gen{g}", store),
                rank=ranks[device],
                world_size=len(ranks),
                timeout=short,
            )
            groups = build_groups(plan, device, ranks, timeout=short)
            stop = join_stop(faults, device, it)
            if stop is not None:  # the injected death (or hang) during a rebuild
                fail_now(stop, device, it, results, heart)
            t1 = time.perf_counter()
            steps = it if job.resume else it - job.start_iteration  # committed optimizer steps
            if source is not None:
                holding, old_snaps = held.get(source[0], (None, {}))
                hold = holders(source[1]) if job.snapshots else None
                init = transfer(source[1], holding, plan, device, ranks, steps, old_snaps, hold)
            elif job.resume:  # a whole-job restart: state from the checkpoint
                init = load_init(job.resume, plan, device)
            t2 = time.perf_counter()
            worker = None if plan.stage_of(device) is None else Worker(plan, device, groups, job, init)
            if worker is not None and job.snapshots:
                snaps.update(exchange(plan, device, ranks, holding_of(worker)))
            long = timedelta(seconds=PG_TIMEOUT_S)  # heartbeats, not this, catch a hung peer
            dist.distributed_c10d._set_pg_timeout(long)
            groups.set_timeout(long)
        except RuntimeError as e:  # a peer died or hung during the rebuild (gloo raised or timed out)
            failed = f"join: {type(e).__name__}: {e}"[:300]
        if failed is not None:  # outside the except block: its traceback holds the groups too
            worker = groups = init = None
            _teardown()
            results.put(("abort", device, {"generation": g, "iter": it, "error": failed}))
            msg = pickle.loads(_wait_key(store, plan_key(g + 1)))
            continue
        init = None
        timing = {"group_s": t1 - t0, "transfer_s": t2 - t1, "build_s": time.perf_counter() - t2}
        results.put(("joined", device, {"generation": g, "teardown_s": teardown_s, **timing}))
        leave = (
            "standby"
            if worker is None
            else _iterate(worker, g, it, end, faults, store, results, ranks, snaps, heart)
        )
        t_left = time.perf_counter()
        if leave != "end":  # a standby member holds nothing but still takes part in the next transfer
            held[g] = (None if worker is None else holding_of(worker), snaps)
        elif job.return_state:
            results.put(("state", device, worker.state_numpy()))
        # Drop every reference to this generation's groups before destroying them: the sockets
        # close, and peers still blocked on this member fail at once (the abort cascade).
        worker = groups = None
        _teardown()
        teardown_s = time.perf_counter() - t_left
        if leave == "end":
            break
        msg = pickle.loads(_wait_key(store, plan_key(g + 1)))
    results.put(("done", device, None))


def fail_now(fault, device: int, it: int, results, heart: Heartbeat | None = None) -> None:
    """Carry out an injected `stop`: say when (for the recovery measurement), then exit hard like a
    crashed process, or, with `hang`, freeze (SIGSTOP: alive but silent, like a hung device).
    `heart` is stopped first: frozen mid-write, a process would keep a queue's cross-process write
    lock and silence every member of its node."""
    results.put(("stopping", device, {"iter": it, "time": time.time(), "hang": fault.hang}))
    if heart is not None:
        heart.stop()
    if fault.hang:
        time.sleep(0.2)  # let the queue's feeder thread deliver the message first
        os.kill(os.getpid(), signal.SIGSTOP)
    results.close()
    results.join_thread()
    os._exit(1)


def _iterate(
    worker: Worker, g: int, it: int, end: int, faults, store, results, ranks, snaps: dict, heart=None
) -> str:
    """Run and commit iterations from `it`; returns why the generation ends: next | abort | end.
    With `job.snapshots`, `snaps` is refreshed after every committed step (`snapshot.exchange`).
    `heart`: the heartbeat, stopped by an injected stop."""
    device, decision = worker.device, {}

    def before_step(k: int, losses: list, wall_s: float) -> None:
        results.put(("reached", device, {"generation": g, "iter": k, "losses": losses, "wall_s": wall_s}))
        verdict = store.get(decision_key(g, k)).decode()
        if verdict == "abort":
            raise Aborted(f"iteration {k} aborted by the controller")
        verdict, _, news = verdict.partition("+")
        if news == "faults":  # time-keyed faults or fault ends resolved at this commit
            faults[:] = pickle.loads(store.get(faults_key(g, k)))
        decision["verdict"] = verdict

    worker.before_step = before_step
    while it < end:
        stop, worker.slow, worker.link = faults_at(faults, device, it)
        if stop is not None and stop.phase == "start":
            fail_now(stop, device, it, results, heart)
        worker.on_allreduce = (
            None if stop is None else (lambda f=stop, k=it: fail_now(f, device, k, results, heart))
        )
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
