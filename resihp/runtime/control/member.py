"""Worker side of the elastic runtime: generations, the commit protocol, abort, state transfer.

A member process loops over Plan generations. For generation g it joins the gloo world of the
generation's members (plan devices and standby workers, ranked in ascending id) through
`PrefixStore(f"gen{g}", store)`, builds its groups, receives its state (`transfer`), and runs
iterations. At STEP of iteration k it reports `Reached` (with its losses) and blocks on the
controller's `Decision` under `decision/{g}/{k}` in the store, as its agent relays it (`relay.py`):

* `Verdict.COMMIT`: apply the optimizer step, go on with k + 1;
* `Verdict.NEXT`: apply the step, then leave g for the generation published as `plan/{g+1}`;
* `Verdict.ABORT`: a member died; skip the step (the state stays the one committed at k − 1) and
  join g+1.

A decision that carries faults (`Decision.faults`: the controller resolved time-keyed faults or
fault ends at this commit, `faults.TimedFaults`) replaces the member's faults before it goes on;
every generation's body (`protocol.Generation`) carries them too.

Joining g: the member reports `Joining` and waits on the store key `go/{g}` (`liveness.JoinBarrier`):
the controller writes `Gate.GO` once every member of g arrived, or `Gate.ABORT` when a member died
first, so a death between generations never reaches gloo. After `go` the rendezvous and group
building run with a short timeout (`JOIN_TIMEOUT_S`); a join that fails there or in the state
transfer (a peer died or hung during the rebuild: gloo raises, at once for a closed socket) is torn
down like a generation, reported as `Abort`, and the member waits for g+1. A member keeps the state
it held when it left each generation it joined (`held`), so g+1 can transfer from the last
generation every survivor joined (the body's `source`), even when g itself never ran an iteration.

A member is spawned by its node's agent (`agent.py`) and exits when that agent is gone. It reaches
the controller's store at the address its `MemberArgs` name. It beats: a daemon thread sends a
`Heartbeat` on its node's heartbeat channel every `HEARTBEAT_S`
(`liveness.HeartbeatThread`), whatever the main thread waits for, and the agent forwards the beats
to the controller; a frozen process goes silent and the controller has its agent kill it
(`liveness.Liveness`). Every other message goes straight to the controller's channel.

The backend is the job's (`run.backend`): gloo on CPU, NCCL on CUDA, where the member takes its
node-local GPU (`exec.device.member_device`) and leaves a failed generation by aborting its
communicators, bounded, instead of destroying them (`abort.py`: a member whose abort hangs exits
and re-joins fresh).

A collective that fails because a peer died raises RuntimeError; the member reports `Abort` and
leaves at once. Leaving drops every reference to the generation's process groups and destroys
them, which closes their sockets, so peers blocked on *this* member fail in turn — the failure
cascades through the world in milliseconds instead of waiting for gloo's timeout. A standby member
(in the world, not in the plan) only serves/receives state and waits for the next generation.
"""

from __future__ import annotations

import gc
import os
import signal
import time
import traceback
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from ..exec.device import member_device
from ..exec.groups import build_groups
from ..exec.iteration import Hooks
from ..exec.worker import Worker
from ..faults import faults_at, join_stop
from ..state.checkpoint import Saver, load_init
from ..state.snapshot import Keeper
from ..state.transfer import holding_of, transfer
from .abort import (
    ABORT_TIMEOUT_S,
    NCCL_TIMEOUT_S,
    AbortWatch,
    abort_communicators,
    abort_groups,
    bounded,
    destroy_groups,
    nccl_env,
)
from .bind import gloo_backend
from .board import Board
from .liveness import HeartbeatThread
from .pids import watch
from .protocol import (
    ABORT_HUNG_EXIT,
    PG_TIMEOUT_S,
    Abort,
    Done,
    Error,
    Gate,
    Generation,
    Joined,
    Joining,
    MemberArgs,
    Reached,
    Record,
    Saved,
    State,
    Stopping,
    Verdict,
)
from .records import trace_line
from .relay import Relayed
from .transport import Channel, Unreachable, never_reconnect

JOIN_TIMEOUT_S = 10.0  # rendezvous + group building of a generation, once every member is at `go`


class Aborted(Exception):
    """The controller aborted the iteration in flight."""


def member_main(blob: bytes, beats: Channel, results: Channel, agent: int, decisions) -> None:
    """Process entry point (spawned by the agent process `agent`); `blob`: its `MemberArgs`.
    `beats`: the agent's heartbeat channel; `results`: the controller's; `decisions`: its pipe to
    the agent's `relay.DecisionRelay`."""
    args = MemberArgs.decode(blob)
    never_reconnect()  # a member that lost the store is done: its agent fences the node
    watch(agent, lambda: os._exit(3))  # a dead agent (a dead node) takes its members down
    # The modules preloaded by the forkserver (torch, ...) are millions of objects: a full
    # collection over them holds the GIL for 0.1-1 s, which silences the heartbeat thread; frozen,
    # they are never scanned, and `gc.collect()` at a generation change takes milliseconds.
    gc.freeze()
    heart = HeartbeatThread(args.device, beats, reports=results)

    def body() -> None:
        torch.set_num_threads(1)
        timeout = timedelta(seconds=PG_TIMEOUT_S)
        store = dist.TCPStore(args.host, args.port, is_master=False, timeout=timeout)
        _run(args.generation, args.job, args.device, store, Relayed(decisions), results, heart)

    exit_after(args.device, results, body, heart.stop)


def exit_after(device: int, results: Channel, body, before_exit: Callable[[], None] | None = None) -> None:
    """Run a worker process's `body()`, report an exception to the controller with its traceback
    (unless the controller is out of reach: then its agent fences the node), call `before_exit`
    (the heartbeat's stop) and exit without interpreter teardown (torch's takes seconds)."""
    try:
        body()
        code = 0
    except BaseException:
        code = 1
        try:
            results.send(Error(device, traceback.format_exc()))
        except Unreachable:
            pass
    if before_exit is not None:
        before_exit()
    os._exit(code)


def _teardown(nccl: bool = False, failed: bool = False, abort=abort_groups, on_hang=None) -> None:
    """Destroy this generation's groups (the caller dropped every reference to them, so their sockets
    close now and peers still blocked on this member fail at once). On NCCL, `abort` them after a
    failure, and exit through `on_hang` when that (or the destroy) does not return in time."""
    if nccl:
        bounded(abort if failed else destroy_groups, ABORT_TIMEOUT_S, on_hang)
    elif dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()


def _hung(device: int, results: Channel, heart: HeartbeatThread):
    """The exit of a member whose abort did not return (its agent reports the code)."""

    def on_hang() -> None:
        results.send(Stopping(device, -1, time.time(), False))
        heart.stop()
        os._exit(ABORT_HUNG_EXIT)

    return on_hang


def _run(
    gen: Generation | None, job, device: int, store, decisions: Relayed, results: Channel,
    heart: HeartbeatThread, abort=abort_groups,
) -> None:  # fmt: skip
    """`decisions`: where it takes each `Decision` (its agent's relay); `abort`: how an NCCL member
    aborts its groups when it leaves a failed generation (injectable: the tests make it hang)."""
    board = Board(store)
    nccl = job.backend == "nccl"
    on_hang = _hung(device, results, heart)
    if nccl:
        nccl_env()
        guard = AbortWatch(store, lambda: bounded(abort_communicators, ABORT_TIMEOUT_S, on_hang))
    dev = member_device(job, device)
    end = job.start_iteration + job.iterations
    # generation -> {iteration: (Holding, snapshots)}: the committed states before those iterations
    # this member left it with (its worker's at the iteration it left at; with snapshots also the
    # older complete tag, for a rollback by one iteration: `adapt/rollback.py`)
    held: dict[int, dict[int, tuple]] = {}
    teardown_s = 0.0  # leaving the previous generation: holding copy, group destruction
    faults = list(gen.faults)  # every fault resolved so far (iteration-keyed), updated in place
    saver = Saver()  # checkpoint writes in the background, across generations
    while gen is not None:
        g, plan, it = gen.generation, gen.plan, gen.start
        faults[:] = gen.faults
        source = gen.source  # (generation, plan) whose held state g starts from; None: seed/checkpoint
        for k in [k for k in held if source is None or k < source[0]]:
            del held[k]  # never a transfer source again (`recovery.source_generation` is monotone)
        results.send(Joining(device, g))
        if board.wait_gate(g) is Gate.ABORT:  # superseded before its rendezvous
            gen = board.generation(g + 1)
            continue
        ranks = {d: r for r, d in enumerate(sorted(gen.members))}
        worker = groups = init = keeper = commits = None  # keeper (snapshot.py): the shards kept for buddies
        failed = None
        t0 = time.perf_counter()
        if nccl:  # a death during the join: the controller aborts `decision/{g}/{it}` (NCCL won't raise)
            guard.at(g, it)
        try:
            short = timedelta(seconds=JOIN_TIMEOUT_S)
            dist.init_process_group(
                gloo_backend() if job.backend == "gloo" else job.backend,  # (on --advertise: bind.py)
                store=dist.PrefixStore(f"gen{g}", store),
                rank=ranks[device],
                world_size=len(ranks),
                timeout=short,
                **({"device_id": dev} if nccl else {}),
            )
            if nccl:  # every rank's first collective on the world (batched P2P needs one before it)
                dist.all_reduce(torch.zeros(1, device=dev))
            groups = build_groups(plan, device, ranks, timeout=short, step=job.optim.grad_clip > 0)
            if job.snapshots:  # a gloo group of its own: the side thread's sends never meet the main's
                keeper = Keeper(plan, device, ranks, dist.new_group(backend=gloo_backend(), timeout=short))
            stop = join_stop(faults, device, it)
            if stop is not None:  # the injected death (or hang) during a rebuild
                fail_now(stop, device, it, results, heart)
            t1 = time.perf_counter()
            steps = it if job.resume else it - job.start_iteration  # committed optimizer steps
            received, planned = 0, None
            if source is not None:
                holding, old_snaps = held.get(source[0], {}).get(it, (None, {}))
                node = (lambda d: d // job.devices_per_node) if job.devices_per_node else None
                init, received, moved = transfer(
                    source[1], holding, plan, device, ranks, steps, old_snaps, dev, node, it
                )
                planned = moved.figures()
            elif gen.restore or job.resume:  # a whole-job restart: state from the checkpoint
                init = load_init(gen.restore or job.resume, plan, device)
            t2 = time.perf_counter()
            commits = Commits(g, device, faults, decisions, results, heart)
            worker = None
            if plan.stage_of(device) is not None:
                worker = Worker(plan, device, groups, job, init, commits.hooks())
            if worker is not None and keeper is not None:  # the start's snapshots before any iteration
                keeper.refresh(holding_of(worker, copy=False), it)
                if not keeper.settle():
                    raise RuntimeError("the snapshot exchange failed: a peer died")
                commits.keeper = keeper
            long = timedelta(seconds=NCCL_TIMEOUT_S if nccl else PG_TIMEOUT_S)  # heartbeats decide first
            dist.distributed_c10d._set_pg_timeout(long)
            groups.set_timeout(long)
        except RuntimeError as e:  # a peer died or hung during the rebuild (gloo raised or timed out)
            failed = f"join: {type(e).__name__}: {e}"[:300]
        if failed is not None:  # outside the except block: its traceback holds the groups too
            if keeper is not None:
                keeper.settle()
            worker = groups = init = keeper = commits = None
            if nccl:
                guard.at(None)
            _saved(saver, results, device)
            _teardown(nccl, True, abort, on_hang)
            results.send(Abort(device, g, it, failed, None))  # (g is no transfer source: not joined)
            gen = board.generation(g + 1)
            continue
        init = None
        results.send(
            Joined(device, g, teardown_s, t1 - t0, t2 - t1, time.perf_counter() - t2, received, planned)
        )
        at = guard.at if nccl else None
        run = worker is not None
        leave, left = _iterate(worker, commits, it, end, keeper, at, saver) if run else ("standby", it)
        if nccl:
            guard.at(None)
        t_left = time.perf_counter()
        if keeper is not None:
            keeper.settle()
        if leave != "end":  # a standby member holds nothing but still takes part in the next transfer
            held[g] = {} if keeper is None else dict(keeper.kept)
            if worker is not None:  # its state at `left`, and the snapshots of that tag it keeps
                held[g][left] = (holding_of(worker, copy=False), held[g].get(left, (None, {}))[1])
        elif job.return_state:
            results.send(State(device, worker.state_numpy()))
        # Drop every reference to this generation's groups before destroying them: the sockets
        # close, and peers still blocked on this member fail at once (the abort cascade).
        worker = groups = keeper = commits = None
        _saved(saver, results, device)
        _teardown(nccl, leave == "abort", abort, on_hang)
        teardown_s = time.perf_counter() - t_left
        if leave == "end":
            break
        gen = board.generation(g + 1)
    results.send(Done(device))


def _saved(saver: Saver, results, device: int) -> None:
    """Wait for the checkpoint writes in flight and report them: before the default process group
    is destroyed (DCP's writer thread asks it for its log lines and fails if it goes away under it)
    and before the member is done."""
    for k, g_saved in saver.wait():
        results.send(Saved(device, g_saved, k))


def fail_now(fault, device: int, it: int, results: Channel, heart: HeartbeatThread | None = None) -> None:
    """Carry out an injected `stop`: say when (for the recovery measurement), then exit hard like a
    crashed process, or, with `hang`, freeze (SIGSTOP: alive but silent, like a hung device).
    `heart` is stopped first (a frozen process must go silent)."""
    results.send(Stopping(device, it, time.time(), fault.hang))
    if heart is not None:
        heart.stop()
    if fault.hang:
        os.kill(os.getpid(), signal.SIGSTOP)
    os._exit(1)


class Commits:
    """The member's side of generation g's commit protocol and fault injection, as the worker's
    `Hooks`: at STEP it reports `Reached` and takes the controller's `Decision` from `decisions` (a
    `Board` or a `relay.Relayed`; `verdict`, read by `_iterate`; faults a commit resolved replace
    `faults`, shared with `_run`); compute and P2P are
    slowed by the faults of the iteration; a `stop` with phase allreduce fires on entering the
    gradient reduction."""

    def __init__(self, g: int, device: int, faults: list, decisions, results: Channel, heart=None):
        self.g, self.device, self.faults, self.decisions, self.results, self.heart = (
            g, device, faults, decisions, results, heart,
        )  # fmt: skip
        self.verdict: Verdict | None = None
        self.keeper: Keeper | None = None  # with snapshots: settled before `Reached` (its certificate)

    def hooks(self) -> Hooks:
        return Hooks(self.before_step, self.on_allreduce, self.slow, self.link)

    def before_step(self, k: int, losses: list, wall_s: float) -> None:
        if self.keeper is not None and not self.keeper.settle():  # (`Reached` says: tag k is complete)
            raise RuntimeError(f"the snapshot exchange before iteration {k} failed: a peer died")
        self.results.send(Reached(self.device, self.g, k, tuple(losses), wall_s))
        decided = self.decisions.decision(self.g, k)
        if decided.verdict is Verdict.ABORT:
            raise Aborted(f"iteration {k} aborted by the controller")
        if decided.faults is not None:  # time-keyed faults or fault ends resolved at this commit
            self.faults[:] = decided.faults
        self.verdict = decided.verdict

    def on_allreduce(self, k: int) -> None:
        stop = faults_at(self.faults, self.device, k)[0]  # (one with phase start never got here)
        if stop is not None:
            fail_now(stop, self.device, k, self.results, self.heart)

    def slow(self, k: int) -> float:
        return faults_at(self.faults, self.device, k)[1]

    def link(self, k: int) -> dict[int, float]:
        return faults_at(self.faults, self.device, k)[2]


def _iterate(
    worker: Worker, commits: Commits, it: int, end: int, keeper: Keeper | None, at=None,
    saver: Saver | None = None,
) -> tuple[str, int]:  # fmt: skip
    """Run and commit iterations from `it`; returns why the generation ends (next | abort | end)
    and the iteration it ends at (the one aborted, or the next to run). With `job.snapshots`,
    `keeper` refreshes the snapshots after every committed step, on its side thread
    (`snapshot.Keeper`), while the next iteration computes; its STEP waits for it; with
    `job.checkpoint_every`, `saver` writes checkpoints in the background and `Saved` is sent for
    each once its files are on disk. `at(g, it)`: told the iteration that starts (the NCCL
    member's `AbortWatch`)."""
    device, g, results, heart = worker.device, commits.g, commits.results, commits.heart
    while it < end:
        if at is not None:
            at(g, it)
        stop = faults_at(commits.faults, device, it)[0]
        if stop is not None and stop.phase == "start":
            fail_now(stop, device, it, results, heart)
        failed = None
        try:
            record = worker.run_iteration(it)
        except (RuntimeError, Aborted) as e:  # a peer died (gloo raises) or the controller aborted
            failed = f"{type(e).__name__}: {e}"[:300]
        if failed is not None:
            worker.opt.zero_grad(set_to_none=True)
            tag = None if keeper is None else keeper.newest()  # (which snapshots a recovery may use)
            results.send(Abort(device, g, it, failed, tag))
            return "abort", it
        if keeper is not None:  # what waiting for the snapshot cost this iteration's main thread
            record["snapshot_wait_s"] = keeper.take_wait()
        results.send(Record(device, record["generation"], it, trace_line(record).encode()))
        it += 1
        every = worker.job.checkpoint_every
        if every and it % every == 0:  # the step of iteration it - 1 is committed: save it
            saver.save(worker.job.checkpoint_dir, it, g, worker.plan, device, holding_of(worker))
        for k, g_saved in saver.poll() if saver is not None else ():
            results.send(Saved(device, g_saved, k))
        if keeper is not None:
            keeper.refresh(holding_of(worker, copy=False), it)
        if commits.verdict is Verdict.NEXT:
            return "next", it
    return "end", it
