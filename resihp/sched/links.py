"""Link fail-slows for `resihp`: candidate transforms that act on known slow links.

A link fail-slow degrades one device pair (`Cluster.links`); the cost model charges it to every
transfer whose rank pairing uses that pair (PP activations, TP rings, DP gradient rings, see
`resihp.cost.comm`). Three levers, all priced by the same ITP as every other candidate:

- `relink`: re-map ranks inside the TP groups that touch a slow link (devices move together with
  their head/FFN shares, so group speeds are unchanged) so that no PP pairing, TP ring or DP ring
  uses the slow pair, when an order exists that avoids it; costs a group rebuild and the shards of
  the re-ranked devices, moved over NVLink inside the node. Also across replicas: a slow link's
  endpoint trades places with the device of the same rank in a DP peer's group at the same stage
  with the same layers and split (the only way to take a PP link between TP-1 stages off the
  pipeline; the two hold the same shard, so no state moves, only groups are rebuilt);
- `reweight`: the global batch re-split over replicas by each replica's rate measured alone on the
  degraded cluster (split.py; the replica whose PP link is slow gets fewer micro-batches and
  leaves the critical path); only for plans without migrated chunks;
- the CPU path (`link_options`): while a slow link is known, PP transfers go through host memory
  and CPU-side RDMA so a slow send does not block the sender's compute stream (the Executor
  "optimizes the communication strategy"; the same switch Adaptra uses).
"""

from __future__ import annotations

from resihp.core.plan import Plan, Stage

from .model import iteration_time
from .split import resplit


def link_options(view) -> dict:
    """Cost-model options while a slow link is known: PP sends over the CPU path."""
    return {"send_blocks": False} if view.links else {}


def link_time(ctx, plan: Plan, cluster, evaluator: str = "auto", iterations=(0,)) -> float:
    """Predicted iteration seconds with `link_options` applied (plain ITP when no link is slow),
    the mean over the packed batches of `iterations`."""
    return iteration_time(ctx, plan, cluster, evaluator, iterations, **link_options(cluster))


def _slow(cluster) -> dict[tuple[int, int], float]:
    out: dict = {}
    for a, b, f in cluster.links:
        if f < 1.0:
            key = (min(a, b), max(a, b))
            out[key] = min(out.get(key, 1.0), f)
    return out


def _hot(replicas, focus: set[int]):
    """(groups holding a `focus` device, PP boundaries next to them, the groups of every DP ring
    through them): the only transfers that can use a pair of focus devices. Re-ranking inside a
    group changes none of these sets, so `relink` computes them once."""
    groups = [
        (d, i)
        for d, stages in enumerate(replicas)
        for i, st in enumerate(stages)
        if not st.hollow and not focus.isdisjoint(st.devices)
    ]
    edges = set()
    for d, i in groups:
        live = [j for j, st in enumerate(replicas[d]) if not st.hollow]
        k = live.index(i)
        edges.update((d, a, b) for a, b in zip(live[max(0, k - 1) : k + 1], live[k : k + 2]))
    layers = {replicas[d][i].layers for d, i in groups}
    rings: dict = {}
    for d, stages in enumerate(replicas):
        for i, st in enumerate(stages):
            if not st.hollow and st.layers in layers:
                rings.setdefault(st.layers, []).append((d, i))
    return groups, sorted(edges), [r for r in rings.values() if len(r) > 1]


def _pairs(replicas, hot):
    """The device pairs the `hot` transfers use (with multiplicity), as comm.py pairs ranks."""
    groups, edges, rings = hot
    for d, i in groups:
        st = replicas[d][i]
        t = st.tp
        if t > 1:
            yield from ((st.devices[k], st.devices[(k + 1) % t]) for k in range(t))
    for d, i, j in edges:
        a, b = replicas[d][i], replicas[d][j]
        ts, tr = a.tp, b.tp
        n = max(ts, tr)
        yield from ((a.devices[c * ts // n], b.devices[c * tr // n]) for c in range(n))
    for ring_pos in rings:
        devs = [replicas[d][i].devices for d, i in ring_pos]
        for k in range(max(len(g) for g in devs)):
            ring = [g[k % len(g)] for g in devs]
            yield from ((ring[r], ring[(r + 1) % len(ring)]) for r in range(len(ring)))


def penalty(replicas, slow: dict, hot=None) -> float:
    """Σ over the slow pairs a plan's `replicas` use of 1/factor (0: no transfer uses a slow link)."""
    if hot is None:
        hot = _hot(replicas, {x for pair in slow for x in pair})
    return sum(
        1.0 / slow[(min(a, b), max(a, b))] for a, b in _pairs(replicas, hot) if (min(a, b), max(a, b)) in slow
    )


def _swapped(st: Stage, p: int, q: int) -> Stage:
    def sw(xs):
        xs = list(xs)
        xs[p], xs[q] = xs[q], xs[p]
        return tuple(xs)

    return Stage(sw(st.devices), st.layers, sw(st.tp_split), sw(st.ffn_split))


def _crossed(replicas, d: int, e: int, i: int, p: int):
    """`replicas` with rank p of group (d, i) and rank p of group (e, i) trading places."""
    a, b = replicas[d][i], replicas[e][i]
    da, db = list(a.devices), list(b.devices)
    da[p], db[p] = db[p], da[p]
    out = list(replicas)
    out[d] = replicas[d][:i] + (Stage(tuple(da), a.layers, a.tp_split, a.ffn_split),) + replicas[d][i + 1 :]
    out[e] = replicas[e][:i] + (Stage(tuple(db), b.layers, b.tp_split, b.ffn_split),) + replicas[e][i + 1 :]
    return tuple(out)


def _peers(replicas, d: int, i: int, peers: int) -> list[int]:
    """Up to `peers` replicas nearest to d whose stage i has the same layers and split as (d, i)."""
    st = replicas[d][i]
    same = [
        e
        for e in sorted(range(len(replicas)), key=lambda e: (abs(e - d), e))
        if e != d
        and i < len(replicas[e])
        and (replicas[e][i].layers, replicas[e][i].tp_split, replicas[e][i].ffn_split)
        == (st.layers, st.tp_split, st.ffn_split)
    ]
    return same[:peers]


def relink(plan: Plan, cluster, rounds: int = 8, peers: int = 4) -> Plan:
    """`plan` with ranks re-mapped so that transfers avoid slow links where possible.

    Greedy: the best single transposition while it lowers `penalty` — a slow link's endpoint with
    another member of its group, or with the same rank of the same stage in one of the `peers`
    nearest DP replicas holding the same layers and split (`_peers`); deterministic, in-group moves
    first on ties. Returns `plan` itself when nothing improves.
    """
    slow = _slow(cluster)
    if not slow:
        return plan
    ends = {x for pair in slow for x in pair}
    hot = _hot(plan.replicas, ends)
    best, score = plan.replicas, penalty(plan.replicas, slow, hot)
    for _ in range(rounds):
        if score <= 0:
            break
        step = None
        for d, i in hot[0]:
            stages, st = best[d], best[d][i]
            for p, q in ((p, q) for p, x in enumerate(st.devices) if x in ends for q in range(st.tp)):
                if q == p:
                    continue
                cand = best[:d] + (stages[:i] + (_swapped(st, p, q),) + stages[i + 1 :],) + best[d + 1 :]
                s = penalty(cand, slow, hot)
                if s < score - 1e-12 and (step is None or s < step[0]):
                    step = (s, cand)
        for d, i in hot[0]:  # across replicas: the focus devices change groups, so `hot` is rebuilt
            for p in (p for p, x in enumerate(best[d][i].devices) if x in ends):
                for e in _peers(best, d, i, peers):
                    cand = _crossed(best, d, e, i, p)
                    s = penalty(cand, slow)
                    if s < score - 1e-12 and (step is None or s < step[0]):
                        step = (s, cand)
        if step is None:
            break
        score, best = step
        hot = _hot(best, ends)
    return plan if best is plan.replicas else plan.with_changes(replicas=best)


def reweight(ctx, plan: Plan, cluster, evaluator: str = "auto", iterations=(0,)) -> Plan:
    """The global batch re-split over replicas by rate (split.resplit), each replica's ITP alone
    taken under `link_options` (the analytic view does not see links)."""
    return resplit(ctx, plan, cluster, lambda alone: link_time(ctx, alone, cluster, evaluator, iterations))


def link_candidates(ctx, cands: list[tuple[str, Plan]], cluster, evaluator: str = "auto", lean: bool = False):
    """Candidates plus their relinked and re-weighted variants (only while a slow link is known).

    `lean` (large jobs): each candidate but "keep" is replaced by its relinked variant, and no
    re-weighted variants, so the ITP passes stay as many as without links.
    """
    if not _slow(cluster):
        return cands
    out, seen = [], set()
    for label, cand in cands:
        rl = relink(cand, cluster)
        variants = [(label, cand)] if label == "keep" or rl is cand or not lean else []
        variants.append((f"{label}+relink", rl))
        if not lean:
            variants.append((f"{label}+reweight", reweight(ctx, rl, cluster, evaluator)))
        for name, var in variants:
            key = (var.replicas, var.microbatches, var.assignment)
            if key not in seen:
                seen.add(key)
                out.append((name, var))
    return out
