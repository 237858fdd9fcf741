"""Shared planning steps: TP groups from the home plan's positions, standbys, snapshot fallback,
and assembling a Plan.

Planning is stateless in the device layout: every decision starts from the positions of the home
plan (`PlanningContext.home`: the job's initial plan) and the cluster as it is now, so re-joined or
recovered devices return to their places and a whole cluster gives back the home plan. Per position
(replica, stage):

1. `choose(position, live members)` picks the group (eq. 4 for the paper, uneven TP for ours);
   unpicked live members go to their node's standby pool;
2. a position that lost a member to fail-stop may take node-local standbys when that scores higher
   (the paper's "reused after later intra-node failures");
3. if every replica lost stage i, a group is rebuilt for it from standbys (state from the snapshot,
   src -1), dismantling the weakest replica for devices when there are no standbys.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from resihp.core.plan import Plan, Stage

Choice = tuple[Stage, float]  # (group with placeholder layers, score; score 0 = hollow)


def select_groups(ctx, cluster, choose: Callable[[tuple, list[int]], Choice]):
    """Per position (d, i): the chosen Stage (hollow if nothing fits), and the standby pool."""
    plan0 = ctx.home
    alive, gpn = cluster.alive, cluster.gpus_per_node
    chosen: dict[tuple[int, int], Choice] = {}
    pool: dict[int, set[int]] = {}
    lost = []
    for d, stages in enumerate(plan0.replicas):
        for i, st in enumerate(stages):
            live = [x for x in st.devices if alive[x]]
            choice = choose((d, i), live)
            chosen[(d, i)] = choice
            for x in live:
                if x not in choice[0].devices:
                    pool.setdefault(x // gpn, set()).add(x)
            if len(live) < len(st.devices):
                lost.append((d, i, st.devices[0] // gpn))
    for d, i, node in lost:
        spare = pool.get(node, set())
        if not spare:
            continue
        old = chosen[(d, i)]
        cands = sorted(set(old[0].devices) | spare)
        new = choose((d, i), cands)
        if new[1] > old[1] * (1 + 1e-9):
            spare |= set(old[0].devices)
            spare -= set(new[0].devices)
            chosen[(d, i)] = new
    return chosen, pool


def cover_lost_stages(ctx, chosen, pool, choose) -> list[int]:
    """Snapshot fallback in place: give every stage index at least one live group.

    Returns the stage indices rebuilt from the snapshot. Raises ValueError when the live devices
    cannot hold every stage.
    """
    plan0 = ctx.home
    dp, pp = plan0.dp, len(plan0.replicas[0])
    rebuilt = []
    for i in range(pp):
        while all(chosen[(d, i)][1] <= 0 for d in range(dp)):
            best = None
            for node in sorted(pool):
                cands = sorted(pool[node])
                if cands:
                    c = choose((0, i), cands)
                    if c[1] > 0 and (best is None or c[1] > best[1][1]):
                        best = (node, c)
            if best is not None:
                node, c = best
                d = max(range(dp), key=lambda e: (sum(chosen[(e, s)][1] > 0 for s in range(pp)), -e))
                chosen[(d, i)] = c
                pool[node] -= set(c[0].devices)
                rebuilt.append(i)
                continue
            live = [e for e in range(dp) if any(chosen[(e, s)][1] > 0 for s in range(pp))]
            if len(live) <= 1:
                raise ValueError(
                    f"layers of stage {i} have no surviving copy and the live devices cannot rebuild it"
                )
            victim = min(live, key=lambda e: (sum(chosen[(e, s)][1] > 0 for s in range(pp)), -e))
            for s in range(pp):
                st = chosen[(victim, s)][0]
                for x in st.devices:
                    pool.setdefault(x // ctx.cluster.gpus_per_node, set()).add(x)
                chosen[(victim, s)] = (Stage((), st.layers), 0.0)
    return rebuilt


def packed(chosen, dp: int, pp: int):
    """`chosen` with the groups of every stage index re-dealt over the replicas so the slow ones
    gather in the replicas already slowest, or None when that moves nothing.

    A replica runs at the pace of its slowest stage (a layer split is integral, so a stage slowed
    by a fifth can cost a replica a whole layer's share of its rate), so k slow groups spread over
    k replicas cost about k replicas' balance where gathered in one they cost about one; the
    re-split of the global batch (split.py) then gives that replica fewer micro-batches. Groups
    keep their devices (TP stays inside its node) and change only the replica they serve: only
    PP pairings and the layer splits change. Replicas are ranked by their summed speed deficit
    (most degraded first, ties: lowest index); at each stage index the slowest group goes to the
    first replica, the next to the second, and so on (ties: the group already there stays).
    Only for plans without hollow groups."""
    speed = {g: c[1] for g, c in chosen.items()}
    if any(v <= 0 for v in speed.values()):
        return None
    top = [max(speed[(d, i)] for d in range(dp)) for i in range(pp)]
    deficit = [sum(1.0 - speed[(d, i)] / top[i] for i in range(pp)) for d in range(dp)]
    order = sorted(range(dp), key=lambda d: (-deficit[d], d))
    rank = {d: k for k, d in enumerate(order)}
    out = {}
    for i in range(pp):
        groups = sorted(range(dp), key=lambda d: (speed[(d, i)], rank[d]))
        for k, home in enumerate(groups):
            out[(order[k], i)] = chosen[(home, i)]
    return None if out == chosen else out


def standby_of(pool) -> tuple[int, ...]:
    return tuple(sorted(x for s in pool.values() for x in s))


def with_layers(st: Stage, layers: tuple[int, int]) -> Stage:
    if st.hollow:
        return Stage((), layers)
    return Stage(st.devices, layers, st.tp_split, st.ffn_split)


@dataclass(frozen=True)
class Draft:
    """A plan before its migration moves exist (a Plan with hollow stages needs them to validate)."""

    ctx: object  # the PlanningContext
    replicas: tuple
    microbatches: tuple
    standby: tuple = ()

    @property
    def model(self):
        return self.ctx.model

    @property
    def dp(self) -> int:
        return len(self.replicas)

    @property
    def global_microbatches(self) -> int:
        return sum(self.microbatches)

    @property
    def hollow(self) -> bool:
        return any(st.hollow for stages in self.replicas for st in stages)

    def to_plan(self, moves=(), generation: int = 0) -> Plan:
        return Plan(
            self.ctx.model, self.replicas, self.microbatches, self.ctx.schedule, tuple(moves),
            self.standby, generation,
        )  # fmt: skip


def assemble(ctx, chosen, splits, standby=()) -> Draft:
    """The draft plan with per-replica layer counts `splits[d]` over the chosen groups."""
    plan0 = ctx.home
    replicas = []
    for d, stages in enumerate(plan0.replicas):
        bounds = [sum(splits[d][:k]) for k in range(len(stages) + 1)]
        replicas.append(
            tuple(with_layers(chosen[(d, i)][0], (bounds[i], bounds[i + 1])) for i in range(len(stages)))
        )
    return Draft(ctx, tuple(replicas), plan0.microbatches, tuple(standby))
