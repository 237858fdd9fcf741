"""Controller of the elastic runtime: commits iterations, publishes Plan generations, survives stops.

The controller (the calling process) hosts the `TCPStore` and reads the members' messages; one agent
process per node (`agent.py`) spawns, watches, kills and reaps that node's member processes
(`member.py`) on its commands and reports their exits and heartbeats.

* Commit: iteration k of generation g is committed when every plan device of g reported `reached`
  at its STEP; the controller then writes `decision/{g}/{k}` = `commit` (or `next` when a planned
  replan starts at k + 1, after publishing `plan/{g+1}`). The committed history holds each
  iteration exactly once, with the losses of the generation that committed it.
* Time-keyed faults (`faults.TimedFaults`): the controller's clock starts when it first writes
  `go` (every member of the first generation is at its rendezvous: process start-up is excluded).
  At the commit of k, time-keyed faults that are due become faults of iteration k + 1 and
  `duration_s` faults that are over end at k + 1; the controller then writes every resolved fault
  so far to `faults/{g}/{k}` and says so in the decision (`commit+faults`, `next+faults`). Every
  plan body and re-joining member's message carries them too.
* Liveness (`liveness.py`): every member beats every 0.25 s (through its agent); one silent for
  `heartbeat_timeout_s` is hung (a frozen process, a hung device) and its agent SIGKILLs it — its
  sockets close, so peers blocked in a collective with it fail at once — and from then on it is a
  fail-stop (`"cause": "heartbeat"`; a process that exited by itself: `"cause": "exit"`). A member
  with no first heartbeat within `start_timeout_s` of its spawn fails the job (`WorkerFailed`). An
  agent that exits or is silent for `heartbeat_timeout_s` is a dead node: every device of it is a
  fail-stop (`"cause": "node"`).
* Fail-stop: a member process that exited is a `fail-stop` of its device. The controller asks the
  scheduler policy for generation g+1 over the survivors (`reconfig.replan_after_stop`, falling
  back to `shrink_plan`), publishes it, then writes `abort` for
  the iteration in flight: survivors skip its step, join g+1, receive lost shards from a DP peer
  and re-run it. A member that reports a failed collective while no process died, or a member
  error, ends the job with `WorkerFailed` (every child reaped).
* Join barrier: members of generation g start its gloo rendezvous only once the controller wrote
  `go/{g}` (every member arrived, alive). A death before that supersedes g (`abort`); a death
  after it fails the survivors' join (gloo raises, or the short join timeout). Either way the
  next generation is replanned from, and transfers from, the last generation every survivor
  joined (`liveness.source_generation`) — a rebuild that failed ran nothing and committed nothing.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import time
from collections.abc import Callable

import torch.distributed as dist

from resihp.core.plan import Plan

from .agent import Agents
from .calibrate import calibrate_hardware
from .checkpoint import savers, write_meta
from .faults import FaultEnd, TimedFaults
from .launch import JobSpec, WorkerFailed, _gather
from .liveness import (
    HEARTBEAT_TIMEOUT_S,
    START_TIMEOUT_S,
    Inbox,
    JoinBarrier,
    Liveness,
    go_key,
    source_generation,
)
from .member import decision_key, faults_key, plan_key
from .reconfig import grow_plan, replan_after_slow, replan_after_stop
from .slowwatch import SlowWatch, slow_event
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
    heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S,
    start_timeout_s: float = START_TIMEOUT_S,
    devices_per_node: int | None = None,
) -> dict:
    """Run `job` from `plan` (generation 0), switching to each `(iteration, plan)` of `replans` at
    that iteration boundary and recovering from member deaths; returns records, state and events.

    `on_commit(it, plan, payloads)` is called once per committed iteration with each plan device's
    {"losses", "wall_s"} (device order). The result: {"records": {it: [trace records]}, "state":
    replica -> full state dict of the final plan (with `job.return_state`), "events", "plans",
    "pids": every agent and member process}. With `detect_slow`, committed iterations' compute
    (and, with `job.link_mb_per_s`, P2P transfer) timings go to `SlowWatch`; its new `fail-slow` /
    `link-slow` reports go to the scheduler `policy` (`reconfig.replan_after_slow`; None or no
    usable plan: the `rebalance_slow` rule), whose plan runs from the next iteration boundary on.
    After a fail-stop, generation g+1 comes from the `policy` too (`reconfig.replan_after_stop`;
    None: the `shrink_plan` rule).
    A member silent for `heartbeat_timeout_s` is killed (then a fail-stop); one with no heartbeat
    `start_timeout_s` after its spawn fails the job. Devices `d` with the same `d // devices_per_node`
    (None: all) form a node with one agent; a node whose agent dies or goes silent loses them all.
    `faults` (`faults.validate_faults`) may be time-keyed (resolved at commits: `TimedFaults`); the
    result's "faults" lists (fault as given, iteration it took effect at, seconds on the clock) of
    each time-keyed one that was resolved.
    """
    replans = {it: p for it, p in replans}
    end = job.start_iteration + job.iterations
    timed = TimedFaults(faults, job.start_iteration, end)
    rejoins: dict[int, list[int]] = {}
    for f in timed.faults:
        if f.kind == "rejoin":
            rejoins.setdefault(f.at_iter, []).append(f.device)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    results = mp.get_context("spawn").Queue()
    gen, cur, it = 0, plan, job.start_iteration
    members = set(plan.devices()) | set(plan.standby)
    msg0 = {"generation": 0, "plan": plan, "members": sorted(members), "start": it, "source": None}
    msg0["faults"] = tuple(timed.faults)
    origin = None  # the fault clock: time.monotonic() when the first `go` was written
    records, shards, events, plans = {}, {}, [], [plan]
    reached: dict[int, dict] = {}
    joined: dict[int, list[dict]] = {}
    done: set[int] = set()
    stopping: dict[int, float] = {}
    recovery: dict | None = None
    abort_since = None
    watch = None
    if detect_slow and job.timing:
        # the first baseline also calibrates the hardware the policy plans on (calibrate.py)
        fit = lambda g, recs: calibrate_hardware(plans[g], job.workload, recs, job.link_mb_per_s)  # noqa: E731
        watch = SlowWatch(links=job.link_mb_per_s > 0, calibrate=fit)
    why: dict[int, tuple[str, int]] = {}  # iteration -> (reason, generation) of a fail-slow replan
    saved: dict[int, set[int]] = {}  # checkpoint iteration -> devices that wrote their shards
    liveness = Liveness(heartbeat_timeout_s, start_timeout_s)
    agents = Agents(results, devices_per_node, heartbeat_timeout_s, start_timeout_s)
    inbox = Inbox(results, liveness, nodes=agents.liveness, track=agents.track)
    barrier = JoinBarrier()
    barrier.open(0, members)
    joined_devs: dict[int, set[int]] = {}  # generation -> members that completed its join
    bodies: dict[int, dict] = {0: msg0}
    killed: dict[int, str] = {}  # device -> why the controller killed it (heartbeat | node)
    aborts: dict[int, str] = {}  # device -> its failed collective, in the current generation

    def publish(new: Plan, start: int, reason: str = "planned", source: tuple | None = None) -> None:
        """Generation g+1; `source`: (generation, plan) whose held state the members transfer from."""
        nonlocal gen, cur
        gen, cur = gen + 1, new.with_changes(generation=gen + 1)
        plans.append(cur)
        body = {"generation": gen, "plan": cur, "members": sorted(members), "start": start, "source": source}
        body["faults"] = tuple(timed.faults)  # every resolved fault so far
        bodies[gen] = body
        barrier.open(gen, members)
        store.set(plan_key(gen), pickle.dumps(body))
        events.append(
            {"iter": start, "kind": "replan", "generation": gen, "devices": cur.devices(), "reason": reason}
        )

    def spawn(dev: int, msg: dict) -> None:
        agents.spawn(dev, pickle.dumps((msg, job, tuple(timed.faults), dev, store.port)))
        liveness.spawn(dev, time.monotonic())
        stopping.pop(dev, None)
        killed.pop(dev, None)
        for got in joined_devs.values():  # a fresh process holds nothing of earlier generations
            got.discard(dev)

    def check_alive() -> None:
        """Have members silent for longer than the heartbeat timeout killed, and fence the nodes
        whose agent died or went silent (their devices become fail-stops); fail the job when a
        spawned member or agent never sent its first heartbeat."""
        now = time.monotonic()
        for d in liveness.hung(now):
            if d in members and d not in done and agents.exitcode(d) is None:
                agents.kill(d)  # SIGKILL works on a stopped process too; its agent reports the exit
                killed[d] = "heartbeat"
                stopping.setdefault(d, time.time() - (now - liveness.last[d]))  # silent since
            liveness.forget(d)
        heard = dict(agents.liveness.last)  # each agent's last beat, before `lost` forgets the dead
        for node, devs in agents.lost(now).items():  # fenced: their processes are dead
            for d in devs:
                killed[d] = "node"
                if node in heard:
                    stopping.setdefault(d, time.time() - (now - heard[node]))  # silent since
                liveness.forget(d)
        late = [d for d in liveness.unstarted(now) if agents.exitcode(d) is None]
        who = [f"worker of device {d}" for d in late] + [f"agent of node {n}" for n in agents.unstarted(now)]
        if who:
            raise WorkerFailed(
                "\n".join(f"{w} sent no heartbeat within {start_timeout_s:g} s" for w in who),
                late,
                agents.pids,
            )

    def fail(errors: dict[int, str]) -> None:
        """Raise WorkerFailed blaming, first, members that died without a word (the likely root
        cause: their peers' collectives then fail with "connection closed"), then those that
        raised; it first waits 1 s for the other consequences of one failure to arrive."""
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            inbox.drain(0.1)
        errors.update({d: p for k, d, p in inbox.pending if k == "error"})
        dead = [d for d in sorted(agents.code) if d not in done and d not in errors and agents.exitcode(d)]
        lines = [f"worker of device {d} died (exit code {agents.exitcode(d)})" for d in dead]
        lines += [f"worker of device {d} failed:\n{tb}" for d, tb in sorted(errors.items())]
        raise WorkerFailed("\n".join(lines), dead + sorted(errors), agents.pids)

    def close(grace_s: float) -> None:
        """Shut the agents down (their members get `grace_s` to exit by themselves), read their last
        reports (every pid), kill a member that outlived its agent."""
        agents.shutdown(grace_s)
        inbox.drain()
        agents.fence()

    try:
        for dev in sorted(members):
            spawn(dev, msg0)
        finished = False
        while not (finished and done >= members):
            kind, dev, payload = inbox.get(0.05) or (None, None, None)
            check_alive()
            # exit code 0: a member that finished; its "done" may still be in the queue
            dead = sorted(d for d in members if d not in done and agents.exitcode(d) not in (None, 0))
            if dead and not finished:
                t_detect = time.time()
                time.sleep(0.1)  # collect the other deaths of one event (two devices stopped at once)
                inbox.drain()
                dead = sorted(d for d in members if d not in done and agents.exitcode(d) not in (None, 0))
                members -= set(dead)
                for d in dead:
                    liveness.forget(d)
                    events.append(
                        {"iter": it, "kind": "fail-stop", "devices": [d], "cause": killed.get(d, "exit")}
                    )
                t0 = time.perf_counter()
                # the state survivors hold: of cur, or of an earlier generation when cur's rebuild failed
                src = source_generation([p.devices() for p in plans], joined_devs, members)
                base = plans[0] if src is None else plans[src]
                try:
                    if src is not None:  # (None: nothing joined yet, start from the seed / checkpoint)
                        source_stages(base, members)
                except ValueError as e:  # a stage lost every replica: its snapshots, else WorkerFailed
                    if not job.snapshots:
                        raise WorkerFailed(
                            f"devices {dead} stopped at iteration {it} and the job cannot go on: {e} "
                            "(run.snapshots = true keeps an in-memory copy of every stage on a peer)",
                            dead,
                            agents.pids,
                        ) from None
                    hold = holders(base)
                    source_stages(base, members, hold)
                    lost = sorted(d for d in base.devices() if d not in members)
                    used = sorted({hold[d] for d in lost if d in hold})
                    events.append({"iter": it, "kind": "snapshot-restore", "devices": used, "lost": lost})
                new, reason = replan_after_stop(
                    plan, base, members, gen + 1, job.workload, policy, absorb=job.snapshots,
                    hardware=None if watch is None else watch.hardware,
                )  # fmt: skip
                plan_s = time.perf_counter() - t0
                publish(new, it, reason, None if src is None else (src, base))
                for g_old in barrier.supersede(gen):  # generations still before their rendezvous
                    store.set(go_key(g_old), "abort")
                store.set(decision_key(gen - 1, it), "abort")
                reached, abort_since, aborts = {}, None, {}
                t_stop = min((stopping.get(d, t_detect) for d in dead), default=t_detect)
                first = t_stop if recovery is None else min(t_stop, recovery["t_stop"])  # not recovered yet
                recovery = {"t_stop": first, "detect_s": t_detect - t_stop, "plan_s": plan_s, "gen": gen}
            elif dead:
                fail({})
            if abort_since is not None and time.monotonic() - abort_since > ABORT_GRACE_S:
                fail({d: f"reported a failed collective, no process died: {e}" for d, e in aborts.items()})
            if (
                not finished
                and barrier.ready(gen)
                and all(agents.exitcode(d) is None for d in barrier.expected[gen])
            ):
                store.set(go_key(gen), "go")  # every member of gen is at its rendezvous, alive
                barrier.decide(gen, "go")
                origin = time.monotonic() if origin is None else origin
            if kind == "error":
                fail({dev: payload})
            elif kind == "stopping":
                stopping[dev] = payload["time"]
            elif kind == "joining":
                barrier.arrive(payload["generation"], dev)
            elif kind == "abort" and payload["generation"] == gen:
                aborts[dev] = payload["error"]
                abort_since = abort_since or time.monotonic()
            elif kind == "joined":
                joined_devs.setdefault(payload["generation"], set()).add(dev)
                got = joined.setdefault(payload["generation"], [])
                got.append(payload)
                if len(got) == len(barrier.expected[payload["generation"]]) and payload["generation"] > 0:
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
                    elapsed = time.monotonic() - origin
                    resolved = timed.resolve(it, elapsed)
                    for f in resolved:
                        if isinstance(f, FaultEnd):
                            events.append(_end_event(f, elapsed - timed.started[f.fault]))
                        elif f.kind == "rejoin":
                            rejoins.setdefault(f.at_iter, []).append(f.device)
                    if it + 1 in why and why[it + 1][1] != gen:  # decided before a fail-stop: stale
                        del replans[it + 1], why[it + 1]
                    nxt = replans.get(it + 1)
                    joiners = [d for d in rejoins.get(it + 1, []) if d not in members]
                    if joiners:  # fresh processes for re-joining devices; the plan grows back
                        members |= set(joiners)
                        nxt = grow_plan(plan, nxt or cur, members, gen + 1)
                        events.append({"iter": it + 1, "kind": "rejoin", "devices": joiners})
                    if nxt is not None:
                        publish(nxt, it + 1, why.pop(it + 1, ("planned",))[0], (gen, cur))
                        for d in joiners:
                            spawn(d, bodies[gen])
                    g_dec, verdict = gen - (nxt is not None), "commit" if nxt is None else "next"
                    if resolved:  # the members read them before they go on
                        store.set(faults_key(g_dec, it), pickle.dumps(tuple(timed.faults)))
                        verdict += "+faults"
                    store.set(decision_key(g_dec, it), verdict)
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
                    found = watch.observe(payload["iter"], g_rec, [got[d] for d in sorted(got)])
                    found = watch.admit(g_rec, found) if g_rec == gen else []
                    if found:  # the scheduler decides (reconfig.replan_after_slow), from it + 1
                        known = (watch.speeds, watch.link_factors)
                        new, reason = replan_after_slow(
                            plan, cur, members, gen + 1, job.workload, policy, *known, found,
                            hardware=watch.hardware,
                        )  # fmt: skip
                        if new is not None and it + 1 < end and (it + 1 not in replans or it + 1 in why):
                            replans[it + 1], why[it + 1] = new, (reason, gen)  # a later report re-decides
                            reason = f"replan at iteration {it + 1}: {reason}"
                        elif new is not None:
                            reason = f"no replan (the run ends or another replan is due): {reason}"
                        events.extend(slow_event(r, reason) for r in found)
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
                liveness.forget(dev)
        close(10.0)  # every member said done: let them exit
    finally:  # (a WorkerFailed carries `agents.pids`: complete once this close read the last reports)
        close(0.0)
        results.close()
        store = None  # shut the TCPStore down with its last reference
    return {
        "records": {k: [v[d] for d in sorted(v)] for k, v in sorted(records.items())},
        "state": _gather(cur, shards) if job.return_state else {},
        "events": events,
        "plans": plans,
        "pids": agents.pids,
        "faults": timed.injected,
    }


def _end_event(end: FaultEnd, lasted_s: float) -> dict:
    """The event of a `duration_s` fault that ends at iteration `end.at_iter` after `lasted_s`."""
    f = end.fault
    return {
        "iter": end.at_iter,
        "kind": "fault-end",
        "fault": f.kind,
        "devices": list(f.devices),
        "duration_s": f.duration_s,
        "lasted_s": lasted_s,
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
