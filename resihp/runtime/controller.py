"""Controller of the elastic runtime: commits iterations, publishes Plan generations, survives stops.

The controller (the calling process) hosts the `TCPStore`, spawns one member process per device
(`member.py`) and acts as their node agent: it watches the processes and reads their messages.

* Commit: iteration k of generation g is committed when every plan device of g reported `reached`
  at its STEP; the controller then writes `decision/{g}/{k}` = `commit` (or `next` when a planned
  replan starts at k + 1, after publishing `plan/{g+1}`). The committed history holds each
  iteration exactly once, with the losses of the generation that committed it.
* Fail-stop: a member process that exited is a `fail-stop` of its device. The controller asks the
  scheduler policy for generation g+1 over the survivors (`reconfig.replan_after_stop`, falling
  back to `shrink_plan`), publishes it, then writes `abort` for
  the iteration in flight: survivors skip its step, join g+1, receive lost shards from a DP peer
  and re-run it. A member that reports a failed collective while no process died, or a member
  error, ends the job with `WorkerFailed` (every child reaped).
"""

from __future__ import annotations

import os
import pickle
import queue as queue_mod
import time
from collections.abc import Callable

import torch.distributed as dist
import torch.multiprocessing as mp

from resihp.core.plan import Plan

from .checkpoint import savers, write_meta
from .launch import JobSpec, _fail, _gather, _reap
from .member import decision_key, member_main, plan_key
from .reconfig import grow_plan, rebalance_slow, replan_after_stop
from .slowwatch import SlowWatch
from .snapshot import holders
from .transfer import source_stages

ABORT_GRACE_S = 5.0  # a reported collective failure with no dead process after this -> WorkerFailed


def launch_elastic(
    plan: Plan,
    job: JobSpec,
    *,
    faults=(),
    replans: list[tuple[int, Plan]] | tuple = (),
    on_commit: Callable[[int, Plan, list[dict]], None] | None = None,
    detect_slow: bool = False,
    policy: str | None = "resihp",
) -> dict:
    """Run `job` from `plan` (generation 0), switching to each `(iteration, plan)` of `replans` at
    that iteration boundary and recovering from member deaths; returns records, state and events.

    `on_commit(it, plan, payloads)` is called once per committed iteration with each plan device's
    {"losses", "wall_s"} (device order). The result: {"records": {it: [trace records]}, "state":
    replica -> full state dict of the final plan (with `job.return_state`), "events", "plans",
    "pids"}. With `detect_slow`, committed iterations' compute timings go to `SlowWatch`; a
    `fail-slow` report re-splits the slow device's stage (`reconfig.rebalance_slow`) from the next
    iteration boundary on. After a fail-stop, generation g+1 comes from the scheduler `policy`
    (`reconfig.replan_after_stop`; None: the explicit `shrink_plan` rule).
    """
    replans = {it: p for it, p in replans}
    rejoins: dict[int, list[int]] = {}
    for f in faults:
        if f.kind == "rejoin":
            rejoins.setdefault(f.at_iter, []).append(f.device)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["resihp.runtime.member", "torch._dynamo"])
    results = ctx.Queue()
    gen, cur, it = 0, plan, job.start_iteration
    end = job.start_iteration + job.iterations
    members = set(plan.devices()) | set(plan.standby)
    msg0 = {"generation": 0, "plan": plan, "members": sorted(members), "start": it}
    by_dev, records, shards, events, plans = {}, {}, {}, [], [plan]
    reached: dict[int, dict] = {}
    joined: dict[int, list[dict]] = {}
    done: set[int] = set()
    stopping: dict[int, float] = {}
    recovery: dict | None = None
    abort_since = None
    watch = SlowWatch(job.start_iteration) if detect_slow and job.timing else None
    blamed: set[tuple[int, int]] = set()  # (generation, device) already reported slow
    speeds: dict[int, float] = {}  # device -> compound speed estimate from fail-slow reports
    saved: dict[int, set[int]] = {}  # checkpoint iteration -> devices that wrote their shards

    def publish(new: Plan, start: int, reason: str = "planned") -> None:
        nonlocal gen, cur
        gen, cur = gen + 1, new.with_changes(generation=gen + 1)
        plans.append(cur)
        body = {"generation": gen, "plan": cur, "members": sorted(members), "start": start}
        store.set(plan_key(gen), pickle.dumps(body))
        events.append(
            {"iter": start, "kind": "replan", "generation": gen, "devices": cur.devices(), "reason": reason}
        )

    procs = []

    def spawn(dev: int, msg: dict) -> None:
        args = (msg, job, tuple(faults), dev, store.port, os.getpid(), results)
        by_dev[dev] = ctx.Process(target=member_main, args=args, daemon=True)
        by_dev[dev].start()
        procs.append(by_dev[dev])

    try:
        for dev in sorted(members):
            spawn(dev, msg0)
        finished = False
        while not (finished and done >= members):
            try:
                kind, dev, payload = results.get(timeout=0.05)
            except queue_mod.Empty:
                kind = None
            # exit code 0: a member that finished; its "done" may still be in the queue
            dead = sorted(d for d in members if d not in done and by_dev[d].exitcode not in (None, 0))
            if dead and not finished:
                t_detect = time.time()
                time.sleep(0.1)  # collect the other deaths of one event (two devices stopped at once)
                dead = sorted(d for d in members if d not in done and by_dev[d].exitcode not in (None, 0))
                members -= set(dead)
                for d in dead:
                    events.append({"iter": it, "kind": "fail-stop", "devices": [d]})
                t0 = time.perf_counter()
                try:
                    source_stages(cur, members)
                except ValueError:  # a stage lost every replica: its snapshots, else ValueError
                    if not job.snapshots:
                        raise
                    hold = holders(cur)
                    source_stages(cur, members, hold)
                    lost = sorted(d for d in cur.devices() if d not in members)
                    used = sorted({hold[d] for d in lost if d in hold})
                    events.append({"iter": it, "kind": "snapshot-restore", "devices": used, "lost": lost})
                new, reason = replan_after_stop(
                    plan, cur, members, gen + 1, job.workload, policy, absorb=job.snapshots
                )
                plan_s = time.perf_counter() - t0
                publish(new, it, reason)
                store.set(decision_key(gen - 1, it), "abort")
                reached, abort_since = {}, None
                t_stop = min((stopping.get(d, t_detect) for d in dead), default=t_detect)
                recovery = {"t_stop": t_stop, "detect_s": t_detect - t_stop, "plan_s": plan_s, "gen": gen}
            elif dead:
                _fail(by_dev, done, {}, results)
            if abort_since is not None and time.monotonic() - abort_since > ABORT_GRACE_S:
                _fail(by_dev, done, {}, results)
            if kind == "error":
                _fail(by_dev, done, {dev: payload}, results)
            elif kind == "stopping":
                stopping[dev] = payload["time"]
            elif kind == "abort" and payload["generation"] == gen and abort_since is None:
                abort_since = time.monotonic()
            elif kind == "joined":
                got = joined.setdefault(payload["generation"], [])
                got.append(payload)
                if len(got) == len(members) and payload["generation"] > 0:
                    events.append(
                        {
                            "iter": it,
                            "kind": "state-transfer",
                            "generation": payload["generation"],
                            "group_s": max(p["group_s"] for p in got),
                            "transfer_s": max(p["transfer_s"] for p in got),
                        }
                    )
            elif kind == "reached" and payload["generation"] == gen:
                reached[dev] = payload
                if set(reached) == set(cur.devices()):
                    nxt = replans.get(it + 1)
                    joiners = [d for d in rejoins.get(it + 1, []) if d not in members]
                    if joiners:  # fresh processes for re-joining devices; the plan grows back
                        members |= set(joiners)
                        nxt = grow_plan(plan, nxt or cur, members, gen + 1)
                        events.append({"iter": it + 1, "kind": "rejoin", "devices": joiners})
                    if nxt is not None:
                        previous = cur
                        publish(nxt, it + 1)
                        for d in joiners:
                            body = {
                                "generation": gen,
                                "plan": cur,
                                "members": sorted(members),
                                "start": it + 1,
                            }
                            spawn(d, {**body, "previous": previous})
                    store.set(decision_key(gen - (nxt is not None), it), "commit" if nxt is None else "next")
                    payloads = [reached[d] for d in sorted(reached)]
                    if on_commit is not None:
                        on_commit(it, plans[-2] if nxt is not None else cur, payloads)
                    if recovery is not None:
                        _close_recovery(recovery, events, joined)
                        recovery = None
                    reached, it = {}, it + 1
                    if it == end:
                        finished = True
                        store.set(plan_key(gen + 1), pickle.dumps(None))  # standby members: stop
            elif kind == "iter":
                got = records.setdefault(payload["iter"], {})
                got[dev] = payload
                g_rec = payload["generation"]
                if watch is not None and len(got) == len(plans[g_rec].devices()):
                    for rep in watch.observe(payload["iter"], g_rec, [got[d] for d in sorted(got)]):
                        bad = rep.devices[0]
                        if (g_rec, bad) in blamed or g_rec != gen:
                            continue
                        blamed.add((g_rec, bad))
                        events.append(
                            {
                                "iter": payload["iter"],
                                "kind": "fail-slow",
                                "devices": [bad],
                                "severity": rep.severity,
                            }
                        )
                        speeds[bad] = speeds.get(bad, 1.0) * rep.severity  # relative to gen's baseline
                        new = rebalance_slow(cur, bad, rep.severity, gen + 1, speeds)
                        if new is not None and it + 1 < end and it + 1 not in replans:
                            replans[it + 1] = new
            elif kind == "saved":  # a checkpoint is complete once every saver of its plan wrote
                got = saved.setdefault(payload["iter"], set())
                got.add(dev)
                wrote = plans[payload["generation"]]
                if got == set(savers(wrote)):
                    path = write_meta(job.checkpoint_dir, payload["iter"], wrote)
                    events.append({"iter": payload["iter"], "kind": "checkpoint", "path": path})
            elif kind == "state":
                shards[dev] = payload
            elif kind == "done":
                done.add(dev)
        for p in procs:
            p.join(10.0)
    finally:
        _reap(procs)
        results.close()
        store = None  # shut the TCPStore down with its last reference
    return {
        "records": {k: [v[d] for d in sorted(v)] for k, v in sorted(records.items())},
        "state": _gather(cur, shards) if job.return_state else {},
        "events": events,
        "plans": plans,
        "pids": [p.pid for p in procs],
    }


def _close_recovery(rec: dict, events: list[dict], joined: dict) -> None:
    """Annotate the last fail-stop event with the kill -> first committed iteration breakdown."""
    got = joined.get(rec["gen"], [])
    stop = next(e for e in reversed(events) if e["kind"] == "fail-stop")
    stop["recovery"] = {
        "kill_to_commit_s": time.time() - rec["t_stop"],
        "detect_s": rec["detect_s"],
        "plan_s": rec["plan_s"],
        **{
            k: max((p[k] for p in got), default=0.0)
            for k in ("teardown_s", "group_s", "transfer_s", "build_s")
        },
    }
