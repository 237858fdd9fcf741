"""Which process groups a Plan needs (pure functions of the Plan), and what processes build from it."""

import json
import os
import pickle
import subprocess
import sys
from datetime import timedelta

import pytest
import torch.distributed as dist

from resihp.core.model_spec import ModelSpec
from resihp.core.plan import Plan, Stage
from resihp.core.segments import grad_segments
from resihp.runtime.exec.groups import _group_device_sets, device_ranks

SPEC = ModelSpec("t", 4, 32, 8, 2, 48, 256)


def test_segments_follow_every_replicas_cuts_and_alignment():
    """Replicas cut at layers 1 and 3: three segments; aligned only where all TP splits agree."""
    r0 = (Stage((0, 1), (0, 1), (4, 4), (24, 24)), Stage((2,), (1, 4), (8,), (48,)))
    r1 = (Stage((3, 4), (0, 3), (4, 4), (24, 24)), Stage((5,), (3, 4), (8,), (48,)))
    plan = Plan(SPEC, (r0, r1), (1, 1), "gpipe")
    segs = grad_segments(plan)
    assert [s.layers for s in segs] == [(0, 1), (1, 3), (3, 4)]
    assert [s.devices for s in segs] == [(0, 1, 3, 4), (2, 3, 4), (2, 5)]
    assert [s.sharded for s in segs] == [True, False, True]
    assert segs[0].rank_sets() == [(0, 3), (1, 4)]
    sets = _group_device_sets(plan)
    # TP groups first, then per-segment groups, deduplicated, same order on every rank
    assert sets == [(0, 1), (3, 4), (0, 3), (1, 4), (2, 3, 4), (2, 5)]


def test_ranks_skip_missing_and_standby_devices():
    """Device ids need not be contiguous; standby devices are not in the world."""
    plan = Plan.uniform(SPEC, 1, 2, 1, 2, devices=[3, 7]).with_changes(standby=(5,))
    assert device_ranks(plan) == {3: 0, 7: 1}
    assert _group_device_sets(plan) == []


RANK = """
import json, pickle, sys
from datetime import timedelta
import torch
import torch.distributed as dist
from resihp.core.segments import grad_segments
from resihp.runtime.exec.groups import build_groups

plan, ranks, device, port = pickle.loads(bytes.fromhex(sys.argv[1]))
store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
dist.init_process_group("gloo", store=dist.PrefixStore("gen0", store), rank=ranks[device],
                        world_size=len(ranks), timeout=timedelta(seconds=60))
order, new_group = [], dist.new_group
def logged(members, **kw):
    order.append(list(members))
    return new_group(members, **kw)
dist.new_group = logged
groups = build_groups(plan, device, ranks, timeout=timedelta(seconds=30), step=True)

def members(pg):
    # who is in the group, measured: the sum of every member's one-hot device vector
    if pg is None:
        return None
    t = torch.zeros(len(ranks))
    t[ranks[device]] = 1.0
    dist.all_reduce(t, group=pg)
    return [d for d, r in sorted(ranks.items()) if t[r] == 1.0]

out = {"order": order, "tp_rank": groups.tp_rank, "tp": members(groups.tp_group),
       "step": members(groups.step_group) if groups.tp_rank >= 0 else None,
       "segments": [[list(seg.layers), seg.sharded, members(groups.reduction_group(seg))]
                    for seg in grad_segments(plan) if device in seg.devices]}
groups.destroy()
dist.destroy_process_group()
print(json.dumps(out))
"""


def _build_in_processes(plan: Plan) -> dict[int, dict]:
    """Every device of `plan` (standby included) builds its groups in its own process, each with
    another hash seed (set and dict orders that depend on it would differ); device -> what it built."""

    devices = sorted(set(plan.devices()) | set(plan.standby))
    ranks = {d: r for r, d in enumerate(devices)}
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60)
    )
    procs = {}
    for k, d in enumerate(devices):
        arg = pickle.dumps((plan, ranks, d, store.port)).hex()
        env = {**os.environ, "PYTHONHASHSEED": str(k + 1)}
        procs[d] = subprocess.Popen([sys.executable, "-c", RANK, arg], env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)  # fmt: skip
    out = {}
    for d, p in procs.items():
        stdout, stderr = p.communicate(timeout=240)
        if p.returncode != 0:
            raise RuntimeError(f"device {d} (rank {ranks[d]}) failed:\n{stderr}")
        out[d] = json.loads(stdout.strip().splitlines()[-1])
    return out


@pytest.mark.slow
def test_every_process_builds_the_same_groups_in_the_same_order():
    """Seven processes (six plan devices, one standby; different hash seeds) create every group in
    one order, and each device's groups hold exactly the devices the reduction rules name: its TP
    group, per layer segment its DP group of equal TP rank (aligned) or every holder (not), and
    (`step=True`, gradient clipping) the group of every plan device, the standby one left out."""
    r0 = (Stage((0, 1), (0, 1), (4, 4), (24, 24)), Stage((2,), (1, 4), (8,), (48,)))
    r1 = (Stage((3, 4), (0, 3), (4, 4), (24, 24)), Stage((5,), (3, 4), (8,), (48,)))
    plan = Plan(SPEC, (r0, r1), (1, 1), "gpipe", standby=(6,))
    built = _build_in_processes(plan)
    orders = {d: b["order"] for d, b in built.items()}
    assert all(o == orders[0] for o in orders.values()), orders
    assert orders[0] == [[0, 1], [3, 4], [0, 3], [1, 4], [2, 3, 4], [2, 5], [0, 1, 2, 3, 4, 5]]
    want = {
        0: (0, [0, 1], [[[0, 1], True, [0, 3]]]),
        1: (1, [0, 1], [[[0, 1], True, [1, 4]]]),
        2: (0, None, [[[1, 3], False, [2, 3, 4]], [[3, 4], True, [2, 5]]]),
        3: (0, [3, 4], [[[0, 1], True, [0, 3]], [[1, 3], False, [2, 3, 4]]]),
        4: (1, [3, 4], [[[0, 1], True, [1, 4]], [[1, 3], False, [2, 3, 4]]]),
        5: (0, None, [[[3, 4], True, [2, 5]]]),
        6: (-1, None, []),  # standby: in every new_group call, in no group
    }
    assert {d: (b["tp_rank"], b["tp"], b["segments"]) for d, b in built.items()} == want
    assert {d: b["step"] for d, b in built.items()} == {**dict.fromkeys(range(6), list(range(6))), 6: None}
