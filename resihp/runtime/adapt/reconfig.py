"""The controller's replanning after a fail-stop, a fail-slow and a re-join (torch-free).

`replan_after_stop` asks the scheduler policy (a `resihp.sched.Policy`, built from the train
config's `[policy]`) and falls back to the explicit rule below; `replan_after_slow` asks it with the
speed and link estimates of fail-slow and link-slow reports and falls back to `rebalance_slow` (or
keeps the plan). The policy plans for `planning_context(...)`: the run's generation-0 plan as the
home plan, its workload, and a Cluster of its real node layout and hardware. Every function here
returns plans; the controller numbers them (the generation of a returned plan means nothing).

`shrink_plan(plan, dead)`: every stage that lost devices keeps its survivors as a smaller TP
group (heads and FFN columns re-split evenly over them, the ResiHP move: no spare needed); a stage
that lost every device takes its whole replica out of service — the replica's other devices go to
standby and its micro-batches are re-spread over the surviving replicas, so the global batch
(and with it the loss and gradient scale) never changes. When every replica lost a whole stage
(dp = 1, say), the first replica with survivors goes on with each dead stage's layers merged into
a neighbouring surviving stage (`absorb=True`, with snapshots only: the state then comes from
them). State for the shrunk stages comes from whichever live shards cover it
(`core.transfer_plan`: peers of other replicas, other TP splits, snapshots). Plans with
migration (`assignment`) keep it only when no replica is dropped.
"""

from __future__ import annotations

from resihp.core.cluster import Cluster
from resihp.core.plan import Plan, build_stage, even_split
from resihp.core.report import FailureReport
from resihp.core.workload import Workload
from resihp.sched.base import Policy, same_work
from resihp.sched.context import PlanningContext


def planning_context(
    home: Plan, workload: Workload, devices_per_node: int | None = None, hardware=None
) -> PlanningContext:
    """What the policy plans for: `home` (generation 0) and `workload` as the run has them, on a
    Cluster of nodes of `devices_per_node` devices (None: one node holds every device, as the
    controller starts one agent for all) of `hardware` (a `Hardware`, e.g.
    `calibrate.calibrate_hardware`'s, or a preset name; None: the `cpu` preset, the CPU workers'
    own). Device ids past the last one the run has (the last node's tail) do not exist: dead."""
    n = max((*home.devices(), *home.standby)) + 1
    per = devices_per_node or n
    nodes = -(-n // per)
    alive = tuple(d < n for d in range(nodes * per))
    return PlanningContext(home, workload, Cluster(nodes, per, hardware or "cpu", alive=alive))


def live_view(ctx: PlanningContext, members: set[int], speeds=None, links=None) -> Cluster:
    """The context's cluster as the controller sees it: `alive` = the live `members`, each device's
    speed and each link's bandwidth estimate (clipped into (0, 1])."""
    n = ctx.cluster.num_devices
    cluster = Cluster(
        ctx.cluster.nodes,
        ctx.cluster.gpus_per_node,
        ctx.cluster.gpu,
        alive=tuple(d in members for d in range(n)),
    )
    for d, p in (speeds or {}).items():
        cluster = cluster.with_speed(d, min(max(p, 1e-3), 1.0))
    for (a, b), f in (links or {}).items():
        cluster = cluster.with_link(a, b, min(max(f, 1e-3), 1.0))
    return cluster


def shrink_plan(plan: Plan, dead: set[int] | list[int], absorb: bool = False) -> Plan:
    """The plan over the survivors of `dead`; ValueError if none fits (with `absorb`, when every
    replica lost a whole stage, `_absorb` merges layers instead)."""
    dead = set(dead)
    replicas, kept, standby = [], [], set(plan.standby) - dead
    for d, stages in enumerate(plan.replicas):
        if any(st.devices and set(st.devices) <= dead for st in stages):
            standby |= {dev for st in stages for dev in st.devices} - dead
            continue
        new = []
        for st in stages:
            alive = [dev for dev in st.devices if dev not in dead]
            new.append(st if len(alive) == len(st.devices) else build_stage(plan.model, alive, st.layers))
        replicas.append(tuple(new))
        kept.append(d)
    if not replicas:
        if absorb:
            return _absorb(plan, dead)
        raise ValueError(f"devices {sorted(dead)} took out every replica: nothing left to train on")
    if len(kept) == len(plan.replicas):
        microbatches, assignment = plan.microbatches, plan.assignment
    else:
        if plan.assignment:
            raise ValueError("a replica with migrated micro-batches was lost: not supported yet")
        microbatches = even_split(plan.global_microbatches, len(kept))
        assignment = ()
    return Plan(plan.model, tuple(replicas), microbatches, plan.schedule, assignment, tuple(sorted(standby)))


def _absorb(plan: Plan, dead: set[int]) -> Plan:
    """Every replica lost a whole stage (e.g. dp = 1): the first replica with survivors goes on, each
    of its dead stages' layers merged into the preceding surviving stage (the following one for a
    dead first stage); every other survivor goes to standby. The lost state comes from snapshots
    (`snapshot.py`); ValueError when no device survives or micro-batches were migrated."""
    for stages in plan.replicas:
        merged: list[list] = []  # [alive devices, lo, hi] per surviving stage, in pipeline order
        pending_lo = None
        for st in stages:
            alive = [dev for dev in st.devices if dev not in dead]
            if not alive:  # dead (or hollow): its layers go to a neighbour
                if merged:
                    merged[-1][2] = st.layers[1]
                elif pending_lo is None:
                    pending_lo = st.layers[0]
                continue
            merged.append([alive, st.layers[0] if pending_lo is None else pending_lo, st.layers[1]])
            pending_lo = None
        if merged and not plan.assignment:
            replica = tuple(build_stage(plan.model, a, (lo, hi)) for a, lo, hi in merged)
            used = {dev for a, _, _ in merged for dev in a}
            alive = set(plan.devices()) | set(plan.standby)
            standby = tuple(sorted(alive - dead - used))
            return Plan(plan.model, (replica,), (plan.global_microbatches,), plan.schedule, (), standby)
    raise ValueError(f"devices {sorted(dead)} took out every replica: nothing left to train on")


def rebalance_slow(
    plan: Plan, device: int, speed: float, known: dict[int, float] | None = None
) -> Plan | None:
    """The plan with `device`'s stage re-split in proportion to speeds (the slow member gets fewer
    heads and FFN columns: ResiHP's uneven TP); None when the stage has no TP peer to shift work to
    (micro-batch migration, the scheduler's other move, is not wired into the runtime yet).
    `known`: every device's speed estimate so far (it then overrides `speed`), so that a second
    report in the same stage does not forget the first one's slow member."""
    where = plan.stage_of(device)
    if where is None:
        return None
    d, i = where
    st = plan.replicas[d][i]
    if st.tp < 2:
        return None
    known = dict(known or {device: speed})
    speeds = [known.get(dev, 1.0) for dev in st.devices]
    new = build_stage(plan.model, st.devices, st.layers, speeds)
    if (new.tp_split, new.ffn_split) == (st.tp_split, st.ffn_split):
        return None
    stages = tuple(new if k == i else s for k, s in enumerate(plan.replicas[d]))
    replicas = tuple(stages if k == d else r for k, r in enumerate(plan.replicas))
    return plan.with_changes(replicas=replicas)


def grow_plan(initial: Plan, current: Plan, alive: set[int]) -> Plan:
    """After a re-join: the initial plan's layout once all its devices are alive again, otherwise the
    current plan with the newcomers on standby (state follows either way, `transfer`)."""
    base = initial if set(initial.devices()) <= alive else current
    return base.with_changes(standby=tuple(sorted(alive - set(base.devices()))))


def replan_after_stop(
    ctx: PlanningContext, current: Plan, members: set[int], policy: Policy | None, absorb: bool = False
) -> tuple[Plan, str]:
    """(plan over the live `members`, why): the scheduler policy's plan (architecture §1: the
    Scheduler decides, the runtime executes), or `shrink_plan` when `policy` is None or the policy
    aborts or returns a plan the runtime cannot take (a dead device, another global batch)."""
    dead = set(current.devices()) - members
    reason = ""
    if policy is not None:
        report = FailureReport("fail-stop", tuple(sorted(dead)))
        decision = policy.adapt(ctx, current, live_view(ctx, members), [report])
        why = _unusable(decision.plan, current, members)
        if why is None:
            return _adopt(decision.plan, members), decision.reason
        reason = f"{policy.name} gave no usable plan ({decision.reason}{why}); "
    return shrink_plan(current, dead, absorb), reason + "shrink: survivors keep their stages"


def replan_after_slow(
    ctx: PlanningContext,
    current: Plan,
    members: set[int],
    policy: Policy | None,
    speeds: dict[int, float],
    links: dict[tuple[int, int], float],
    reports: list[FailureReport],
    before: tuple[dict, dict] | None = None,
) -> tuple[Plan | None, str]:
    """(plan, or None to keep `current`; why) after fail-slow / link-slow / recovered `reports`.

    `speeds` / `links`: every device's speed and link's bandwidth estimate so far, the reports'
    included (`SlowWatch`); `before`: (speeds, links) as they were before the reports (default: each
    report's factor divided out). The scheduler `policy` plans with them, once; its plan is
    taken when it uses live members only, keeps the global micro-batch count, differs from
    `current`, and is an answer to these reports (`Decision.prompted`: on the estimates before them
    the policy would not switch to it — a plan it would pick anyway, its cost model preferring
    another layer split of a healthy job, say, is no answer to this failure). Otherwise, and with
    `policy` None, each slow device's TP stage is re-split by speed (`rebalance_slow`); a slow link
    has no rule.
    """
    reason = ""
    if policy is not None:
        view = live_view(ctx, members, speeds, links)
        before_view = live_view(ctx, members, *(before or _before(speeds, links, reports)))
        decision = policy.adapt(ctx, current, view, list(reports), before=before_view)
        new, why = decision.plan, _unusable(decision.plan, current, members)
        if why is not None:
            reason = f"{policy.name} gave no usable plan ({decision.reason}{why}); "
        elif same_work(new, current):
            reason = f"{decision.reason} keeps the current plan; "
        elif not decision.prompted:
            reason = f"{decision.reason}, a plan it would switch to without these reports too; "
        else:
            return _adopt(new, members), decision.reason
    new = current
    for rep in reports:
        if rep.kind == "fail-slow":
            new = rebalance_slow(new, rep.devices[0], rep.severity, speeds) or new
    if new is current:
        return None, reason + "no rule for this failure (a TP-1 stage or a link): no replan"
    return new, reason + "rebalance: uneven TP split by speed"


def _before(speeds: dict, links: dict, reports: list[FailureReport]) -> tuple[dict, dict]:
    """The estimates as they were before `reports` (each folded in as a factor, `SlowWatch.admit`)."""
    speeds, links = dict(speeds), dict(links)
    for rep in reports:
        known, what = (links, rep.link) if rep.kind == "link-slow" else (speeds, rep.devices[0])
        if what in known:
            known[what] = min(1.0, known[what] / max(rep.severity, 1e-9))
    return speeds, links


def _unusable(new: Plan | None, current: Plan, members: set[int]) -> str | None:
    """Why the runtime cannot take a policy's plan `new` ("" or ": detail"); None: it can."""
    if new is None or not set(new.devices()) <= members:
        return ""
    if new.global_microbatches != current.global_microbatches:
        return ": another global batch"
    return None


def _adopt(new: Plan, members: set[int]) -> Plan:
    """The policy's plan with every other live member on standby."""
    return new.with_changes(standby=tuple(sorted(members - set(new.devices()))))
