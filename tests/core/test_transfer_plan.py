"""The transfer planner per replan kind: what each device lacks, who sends it, and the figures."""

import pytest

from resihp.core.model_spec import ModelSpec, model_preset
from resihp.core.plan import Plan, Stage, build_stage
from resihp.core.shard_layout import stage_param_names
from resihp.core.transfer_plan import (
    ELEMENT_BYTES,
    KINDS,
    cover_gaps,
    extent,
    interval,
    plan_transfer,
    positions,
    shard_bytes,
)
from resihp.core.transfer_volume import inflow
from resihp.cost.memory import shard_params

SPEC = ModelSpec("t", 4, 32, 8, 2, 48, 256)
OLD = Plan.uniform(SPEC, 2, 2, 2, 2)  # r0: [0, 1] L0-1, [2, 3] L2-3; r1: [4, 5], [6, 7]


def node4(d: int) -> int:
    return d // 4


def with_stage(plan: Plan, r: int, i: int, st: Stage, **changes) -> Plan:
    reps = [list(s) for s in plan.replicas]
    reps[r][i] = st
    return Plan(plan.model, reps, plan.microbatches, plan.schedule, **changes)


def check_tiles(tp, new: Plan, alive) -> None:
    """Every device of `new` gets every row of every tensor of its new stage exactly once, from a
    live device holding it (its own shard, or a snapshot of a lost one)."""
    spec = new.model
    for dev, (st, r) in positions(new).items():
        for name in stage_param_names(spec, st.layers):
            got = sorted((p.lo, p.hi) for p in tp.pieces if p.receiver == dev and p.name == name)
            if not got:
                continue  # an unchanged shard
            a, b = interval(spec, name, st, r)
            assert got[0][0] == a and got[-1][1] == b and all(x[1] == y[0] for x, y in zip(got, got[1:]))
    for p in tp.pieces:
        assert p.sender in alive
        assert p.nbytes == (p.hi - p.lo) * extent(spec, p.name)[2] * ELEMENT_BYTES * tp.kinds
    assert tp.bytes_moved == sum(p.nbytes for p in tp.pieces if p.sender != p.receiver)


def test_shard_bytes_agree_with_the_cost_model():
    """One parameter count: the planner's per-device bytes are `cost.memory.shard_params` of the
    runtime's layout (embedding and head whole on every rank) times 4 bytes times 3 kinds."""
    plan = with_stage(OLD, 0, 0, build_stage(SPEC, (0, 1), (0, 2), [3.0, 1.0]))
    for st, r in positions(plan).values():
        first, last = st.layers[0] == 0, st.layers[1] == SPEC.num_layers
        p = shard_params(SPEC, st.num_layers, first, last, st.tp_split, st.ffn_split, r, vocab_parallel=False)
        assert shard_bytes(SPEC, st, r) == p * ELEMENT_BYTES * KINDS


def test_tp_member_excluded():
    """Device 1 lost: device 0 alone runs stage 0 and receives rank 1's half of every split tensor
    from device 5 (the other replica's rank 1), nothing else; bytes moved = the lower bound."""
    new = with_stage(OLD, 0, 0, build_stage(SPEC, (0,), (0, 2)))
    alive = set(range(8)) - {1}
    tp = plan_transfer(OLD, new, alive, node_of=node4)
    check_tiles(tp, new, alive)
    old0 = OLD.replicas[0][0]
    assert tp.lower_bound_bytes == shard_bytes(SPEC, new.replicas[0][0], 0) - shard_bytes(SPEC, old0, 0)
    assert {p.sender for p in tp.pieces if p.sender != p.receiver} == {5}
    assert set(tp.received) == {0}
    assert tp.bytes_moved == tp.lower_bound_bytes == tp.max_received_bytes > 0


def test_layers_moved_come_from_the_same_node():
    """Layer 2 moves from stage 1 to stage 0 of replica 0: devices 0 and 1 receive its shards from
    devices 2 and 3 (their own node: split rows rank for rank, the replicated norms from either,
    balanced); stage 1's devices keep a subset: 0 bytes."""
    st0, st1 = OLD.replicas[0]
    grown = Stage(st0.devices, (0, 3), st0.tp_split, st0.ffn_split)
    shrunk = Stage(st1.devices, (3, 4), st1.tp_split, st1.ffn_split)
    reps = [[grown, shrunk], OLD.replicas[1]]
    new = Plan(SPEC, reps, OLD.microbatches)
    tp = plan_transfer(OLD, new, range(8), node_of=node4)
    check_tiles(tp, new, set(range(8)))
    moved = {(p.sender, p.receiver) for p in tp.pieces if p.sender != p.receiver}
    assert {(2, 0), (3, 1)} <= moved <= {(2, 0), (3, 0), (2, 1), (3, 1)}
    rows = [
        (interval(SPEC, n, st0, r), extent(SPEC, n)[2])
        for n in stage_param_names(SPEC, (2, 3))
        for r in (0, 1)
    ]
    layer2 = sum((b - a) * per_row * ELEMENT_BYTES * KINDS for (a, b), per_row in rows)
    assert tp.bytes_moved == tp.lower_bound_bytes == layer2


def test_migration_only_moves_nothing():
    new = OLD.with_changes(assignment=((0, 1, 1, 1),), generation=1)
    tp = plan_transfer(OLD, new, range(8), node_of=node4)
    assert tp.pieces == ()
    assert tp.figures() == {"bytes_moved": 0, "lower_bound_bytes": 0, "max_received_bytes": 0}


def test_tp_resplit_moves_the_lower_bound():
    """An uneven re-split of stage 1 (heads 6:2, FFN 36:12): each rank needs only the rows it did
    not hold; a kv head whose query group straddles the ranks goes to both."""
    new = with_stage(OLD, 0, 1, build_stage(SPEC, (2, 3), (2, 4), [3.0, 1.0]))
    tp = plan_transfer(OLD, new, range(8), node_of=node4)
    check_tiles(tp, new, set(range(8)))
    assert 0 < tp.bytes_moved <= 1.1 * tp.lower_bound_bytes
    assert set(tp.received) <= {2, 3}
    assert all(p.sender in (2, 3) for p in tp.pieces)  # the same node first


def test_standby_and_back():
    """Device 1 to standby (device 0 alone: it receives rank 1's half), then back: device 1 receives
    its whole shard again (from device 0, its node) and device 0 keeps a subset."""
    alone = with_stage(OLD, 0, 0, build_stage(SPEC, (0,), (0, 2)), standby=(1,))
    away = plan_transfer(OLD, alone, range(8), node_of=node4)
    check_tiles(away, alone, set(range(8)))
    assert set(away.received) == {0} and away.bytes_moved == away.lower_bound_bytes
    assert {p.sender for p in away.pieces if p.sender != 0} == {1}  # (its own node; 1 is alive)
    back = plan_transfer(alone, OLD, range(8), node_of=node4)
    check_tiles(back, OLD, set(range(8)))
    assert set(back.received) == {1}
    assert back.bytes_moved == back.lower_bound_bytes == shard_bytes(SPEC, OLD.replicas[0][0], 1)
    assert {p.sender for p in back.pieces} == {0}


def test_senders_are_balanced():
    """dp = 3: a device back from standby can take each range from two replicas on other nodes;
    the planner splits the work between them (equal distance: the least loaded sender)."""
    old = Plan.uniform(SPEC, 1, 2, 3, 2)  # replicas [0] [1], [2] [3], [4] [5]
    alone = old.with_changes(replicas=((old.replicas[0][0], Stage((), (2, 4))), *old.replicas[1:]),
                             assignment=((0, 0, 1, 1), (0, 1, 1, 2)), standby=(1,))  # fmt: skip
    tp = plan_transfer(alone, old, range(6), node_of=lambda d: d)
    loads = {}
    for p in tp.pieces:
        loads[p.sender] = loads.get(p.sender, 0) + p.nbytes
    assert set(loads) == {3, 5}
    assert abs(loads[3] - loads[5]) <= max(p.nbytes for p in tp.pieces)


def test_a_complete_cover_across_replicas_recovers():
    """Devices 1 and 4 lost (stage 0 of both replicas, one TP member each): devices 0 and 5 together
    hold every row, so nothing is lost; losing 0 and 4 (rank 0 of both) loses layers 0-1's split
    tensors unless snapshots of the lost devices exist."""
    assert cover_gaps(OLD, set(range(8)) - {1, 4}) == []
    gaps = cover_gaps(OLD, set(range(8)) - {0, 4})
    assert gaps and all(n.startswith(("layers.0.", "layers.1.")) and "norm" not in n for n in gaps)
    alive = set(range(8)) - {1, 4}
    new = Plan(SPEC, [[build_stage(SPEC, (0, 5), (0, 2)), OLD.replicas[0][1]]], (4,), standby=(6, 7))
    tp = plan_transfer(OLD, new, alive, node_of=node4)
    check_tiles(tp, new, alive)
    assert tp.pieces == ()  # device 5 keeps the rank-1 shard it held: the same rows, in place
    snaps = {0: 2, 4: 6}
    assert cover_gaps(OLD, set(range(8)) - {0, 4}, snaps) == []
    keep = Plan(SPEC, [[build_stage(SPEC, (1, 5), (0, 2)), OLD.replicas[0][1]]], (4,), standby=(6, 7))
    tp = plan_transfer(OLD, keep, set(range(8)) - {0, 4}, snaps, node_of=node4)
    assert {p.source for p in tp.pieces if p.source != p.sender} <= {0, 4}
    with pytest.raises(ValueError, match="no live copy of layers.0"):
        plan_transfer(OLD, keep, set(range(8)) - {0, 4}, node_of=node4)


def test_large_plans_only_touch_what_changes():
    """llama3-405b over 16,384 devices, one TP member of one stage lost: only that stage's 7
    survivors receive anything, each at most its new shard."""
    spec = model_preset("llama3-405b")
    old = Plan.uniform(spec, 8, 16, 128, 2)
    st = old.replicas[0][0]
    new = with_stage(old, 0, 0, build_stage(spec, st.devices[1:], st.layers))
    tp = plan_transfer(old, new, set(old.devices()) - {st.devices[0]}, node_of=lambda d: d // 8)
    assert set(tp.received) <= set(st.devices[1:])
    assert tp.bytes_moved == tp.lower_bound_bytes
    assert tp.max_received_bytes <= max(shard_bytes(spec, new.replicas[0][0], r) for r in range(7))


def _by_link(tp, node) -> dict[int, tuple[int, int, int, int]]:
    """plan_transfer's pieces summed per receiver by where they come from (its node, another
    node, the fallback -1), and how many layers it receives any tensor of."""
    out: dict[int, list] = {}
    for p in tp.pieces:
        if p.sender == p.receiver:
            continue
        got = out.setdefault(p.receiver, [0, 0, 0, set()])
        got[2 if p.sender == -1 else 0 if node(p.sender) == node(p.receiver) else 1] += p.nbytes
        if p.name.startswith("layers."):
            got[3].add(p.name.split(".")[1])
    return {d: (a, b, c, len(ks)) for d, (a, b, c, ks) in out.items()}


def test_inflow_is_the_planners_bytes_by_link():
    """`inflow` (the simulator's pause, sched/reconfig.py) gives per receiver what the planner's
    pieces send it from its node, from other nodes and from the fallback, on every replan kind."""
    moved = [build_stage(SPEC, (0, 1), (0, 3)), build_stage(SPEC, (2, 3), (3, 4))]
    two_layers = Plan(SPEC, [moved, list(OLD.replicas[1])], OLD.microbatches)
    lost_stage = Plan(SPEC, [[OLD.replicas[0][0], build_stage(SPEC, (4, 5), (2, 4))]], (4,), standby=(6, 7))
    cases = [
        (OLD.with_changes(assignment=((0, 1, 1, 1),)), set(range(8))),  # migration only
        (with_stage(OLD, 0, 0, build_stage(SPEC, (0,), (0, 2))), set(range(8)) - {1}),  # TP member out
        (with_stage(OLD, 0, 1, build_stage(SPEC, (2, 3), (2, 4), [3.0, 1.0])), set(range(8))),  # re-split
        (two_layers, set(range(8))),  # a layer moved between stages
        (lost_stage, set(range(8)) - {2, 3, 6, 7}),  # stage 1 lost in both replicas: the snapshot
    ]
    for new, alive in cases:
        tp = plan_transfer(OLD, new, alive, node_of=node4, fallback=-1)
        got = {d: tuple(f) for d, f in inflow(OLD, new, alive, node4).items()}
        assert got == _by_link(tp, node4)
    assert inflow(OLD, *cases[0], node4) == {}
    assert {f.none for f in inflow(OLD, *cases[-1], node4).values()} != {0}
    with pytest.raises(ValueError):
        plan_transfer(OLD, lost_stage, cases[-1][1], node_of=node4)


def test_inflow_counts_runs_of_layers_held_alike():
    """A stage spanning two old stages: the layers of each old stage are one run; `inflow` counts
    the bytes of every layer (the same as the planner) and every layer it receives."""
    old = Plan.uniform(SPEC, 1, 4, 2, 2)  # replica 0: [0] L0, [1] L1, [2] L2, [3] L3
    stages = [build_stage(SPEC, (0,), (0, 3)), build_stage(SPEC, (3,), (3, 4))]
    new = Plan(SPEC, [stages, list(old.replicas[1])], old.microbatches, standby=(1, 2))
    tp = plan_transfer(old, new, range(8), node_of=node4, fallback=-1)
    got = {d: tuple(f) for d, f in inflow(old, new, range(8), node4).items()}
    assert got == _by_link(tp, node4) and got[0][3] == 2
