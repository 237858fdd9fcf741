"""In-memory snapshots of the committed state on a peer: the source of last resort (issue 7).

With `run.snapshots`, every plan device keeps a copy of one *buddy*'s committed shard (parameters
and AdamW moments) in host memory. The buddy map (`holders`) is a function of the Plan alone: the
stages, listed stage-major (stage index, then replica), hand their shards to the stage `dp`
positions further on in that list, skipping stages with the same stage index, i.e. a stage that
holds other layers (another pipeline stage of the same or another replica) — so one lost stage
index (every replica of it) never takes its snapshot with it. TP rank t sends to rank t mod tp'.

`Keeper`: after every committed optimizer step (and once when a generation starts) a side thread
copies the device's shard into one host buffer (straight from the worker's tensors: one copy, no
whole-holding clone first) and exchanges it with its holder and its buddies, by point-to-point
sends on a gloo group of its own (one `batch_isend_irecv`, no tags: one buffer each way between
two devices), so the main thread's collectives on the generation's groups never interleave with
it. The main thread meanwhile reports the iteration and writes a due checkpoint, and waits for
the exchange (`Keeper.settle`) before the next iteration runs and before it leaves the
generation. It does not overlap the exchange with the next iteration's compute: the committed
state exists on its device alone until its snapshot arrives, so a device that died during that
compute with its snapshot in flight would take the only copy of a stage along (the loss of every
replica of a stage, which the snapshots are for); overlapping needs a rollback by one iteration.
Every
snapshot is tagged with the iteration it is the committed state before (`Holding.at`); an
exchange a death interrupted leaves no snapshot at all (never a stale one kept as if current),
and the next transfer (`transfer.inventory`) counts only snapshots tagged with its start
iteration, learned by every member alike — so a concurrent death can cost a snapshot, never make
two members disagree about which exist. Refreshing every k > 1 commits would need a rollback of
the whole job to the snapshot's iteration; not built.
"""

from __future__ import annotations

import threading
import time

import torch
import torch.distributed as dist

from resihp.core.plan import Plan
from resihp.model import full_shape, slice_tensor, stage_param_names

from .transfer import Holding


def holders(plan: Plan) -> dict[int, int]:
    """device -> the device that keeps its snapshot (devices without one are absent)."""
    stages = sorted(
        (i, r) for r, sts in enumerate(plan.replicas) for i, st in enumerate(sts) if not st.hollow
    )
    out: dict[int, int] = {}
    off = max(1, len(plan.replicas))
    for j, (i, r) in enumerate(stages):
        order = [stages[(j + off + k) % len(stages)] for k in range(len(stages))]
        other = [s for s in order if s[0] != i] or [s for s in order if s != (i, r)]
        if not other:
            continue
        i2, r2 = other[0]
        st, st2 = plan.replicas[r][i], plan.replicas[r2][i2]
        for t, dev in enumerate(st.devices):
            out[dev] = st2.devices[t % len(st2.devices)]
    return out


def _layout(plan: Plan, device: int) -> list[tuple[str, torch.Size]]:
    """(name, shard shape) of `device`'s stage tensors, in canonical order."""
    r, i = plan.stage_of(device)
    st = plan.replicas[r][i]
    t = st.devices.index(device)
    spec = plan.model
    return [
        (
            n,
            slice_tensor(
                spec, n, torch.empty(full_shape(spec, n), device="meta"), st.tp_split, st.ffn_split, t
            ).shape,
        )
        for n in stage_param_names(spec, st.layers)
    ]


def exchange(plan: Plan, device: int, ranks: dict[int, int], holding: Holding, at: int, group=None) -> dict:
    """Send this device's committed shard to its holder, receive the shards it holds; collective over
    the plan's devices (standby members do not call it) on `group` (default: the world). Buffers
    live on the host. `at`: the iteration the state is committed before (the snapshots' tag).
    Returns {source device: Holding}."""
    hold = holders(plan)
    kinds = 1 if holding.moments is None else 3
    ops, bufs = [], {}
    for src in sorted(d for d, h in hold.items() if h == device):
        numel = sum(s.numel() for _, s in _layout(plan, src))
        bufs[src] = torch.empty(numel * kinds)
        ops.append(dist.P2POp(dist.irecv, bufs[src], ranks[src], group))
    if device in hold:
        tensors = [holding.params] + (list(holding.moments) if kinds > 1 else [])
        out = torch.cat([t[n].reshape(-1).cpu() for n, _ in _layout(plan, device) for t in tensors])
        ops.append(dist.P2POp(dist.isend, out, ranks[hold[device]], group))
    for w in dist.batch_isend_irecv(ops) if ops else []:
        w.wait()
    snaps = {}
    for src, buf in bufs.items():
        parts: list[dict[str, torch.Tensor]] = [{} for _ in range(kinds)]
        offset = 0
        for name, shape in _layout(plan, src):
            for k in range(kinds):
                parts[k][name] = buf[offset : offset + shape.numel()].view(shape)
                offset += shape.numel()
        snaps[src] = Holding(parts[0], (parts[1], parts[2]) if kinds > 1 else None, at)
    return snaps


class Keeper:
    """The snapshots one member keeps in a generation (`kept`: source device -> Holding), refreshed
    on a side thread. `group`: a gloo group over the generation's members, for this alone."""

    def __init__(self, plan: Plan, device: int, ranks: dict[int, int], group) -> None:
        self.plan, self.device, self.ranks, self.group = plan, device, ranks, group
        self.kept: dict[int, Holding] = {}
        self.thread: threading.Thread | None = None
        self.busy_s = 0.0  # the side thread's seconds, summed (copy + exchange)
        self.waited_s = 0.0  # the main thread's seconds waiting for it since the last `take_wait`

    def refresh(self, holding: Holding, at: int) -> None:
        """Exchange `holding` (the committed state before iteration `at`; its tensors may be the
        worker's own: they must not change before `settle`) on the side thread."""
        self.settle()
        self.kept = {}  # the previous snapshots are stale from now on

        def work() -> None:
            t0 = time.perf_counter()
            try:
                self.kept = exchange(self.plan, self.device, self.ranks, holding, at, self.group)
            except RuntimeError:  # a peer died mid-exchange: keep nothing rather than a stale copy
                self.kept = {}
            finally:
                self.busy_s += time.perf_counter() - t0

        self.thread = threading.Thread(target=work, name="snapshot", daemon=True)
        self.thread.start()

    def settle(self) -> dict[int, Holding]:
        """Wait for the side thread; the snapshots kept (before the generation's groups go)."""
        if self.thread is not None:
            t0 = time.perf_counter()
            self.thread.join()
            self.thread = None
            self.waited_s += time.perf_counter() - t0
        return self.kept

    def take_wait(self) -> float:
        """The main thread's seconds waiting for the side thread since the last call."""
        waited, self.waited_s = self.waited_s, 0.0
        return waited
