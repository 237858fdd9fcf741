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
it. The exchange of the state committed before iteration t (tag t) runs while t computes: the
main thread waits for it (`Keeper.settle`) only at t's STEP, before it reports `Reached` — so the
optimizer step never changes a tensor the copy still reads, and the commit of t certifies tag t
complete on every plan device — and before it leaves the generation, so that its `Abort` names
the newest tag it holds complete (`Keeper.newest`); the one at a generation's start is waited for
in the join. A death while t computes may take a snapshot of tag t along before it arrived (its
holder never reaches t's STEP, and its `Abort` names t - 1); the recovery then rolls back by one
iteration, to tag t - 1 (`adapt/rollback.py`): every member keeps the two newest complete tags,
its own shard's host copy and the snapshots it holds of each. Every snapshot is tagged with the
iteration it is the committed state before (`Holding.at`); an exchange a death interrupted keeps
nothing of its tag (never a stale copy kept as if current), and the next transfer
(`transfer.inventory`) counts only snapshots tagged with its start iteration, learned by every
member alike — so a concurrent death can cost a snapshot, never make two members disagree about
which exist. Refreshing every k > 1 commits would need a rollback by up to k iterations; not built.
"""

from __future__ import annotations

import functools
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


@functools.lru_cache(maxsize=64)
def _layout(plan: Plan, device: int) -> tuple[tuple[str, torch.Size], ...]:
    """(name, shard shape) of `device`'s stage tensors, in canonical order (cached: the side thread
    asks for it at every exchange, and slicing the meta tensors holds the GIL for milliseconds)."""
    r, i = plan.stage_of(device)
    st = plan.replicas[r][i]
    t = st.devices.index(device)
    spec = plan.model
    meta = {n: torch.empty(full_shape(spec, n), device="meta") for n in stage_param_names(spec, st.layers)}
    return tuple((n, slice_tensor(spec, n, m, st.tp_split, st.ffn_split, t).shape) for n, m in meta.items())


def _unpack(plan: Plan, device: int, buf: torch.Tensor, kinds: int, at: int) -> Holding:
    """`device`'s shard, flattened into `buf` by `exchange`, as views by canonical name."""
    parts: list[dict[str, torch.Tensor]] = [{} for _ in range(kinds)]
    offset = 0
    for name, shape in _layout(plan, device):
        for k in range(kinds):
            parts[k][name] = buf[offset : offset + shape.numel()].view(shape)
            offset += shape.numel()
    return Holding(parts[0], (parts[1], parts[2]) if kinds > 1 else None, at)


def exchange(
    plan: Plan, device: int, ranks: dict[int, int], holding: Holding, at: int, group=None
) -> tuple[Holding, dict[int, Holding]]:
    """Send this device's committed shard to its holder, receive the shards it holds; collective over
    the plan's devices (standby members do not call it) on `group` (default: the world). Buffers
    live on the host. `at`: the iteration the state is committed before (the snapshots' tag).
    Returns (this device's own host copy of `holding`, {source device: Holding})."""
    hold = holders(plan)
    kinds = 1 if holding.moments is None else 3
    tensors = [holding.params] + (list(holding.moments) if kinds > 1 else [])
    out = torch.cat([t[n].reshape(-1).cpu() for n, _ in _layout(plan, device) for t in tensors])
    ops, bufs = [], {}
    for src in sorted(d for d, h in hold.items() if h == device):
        numel = sum(s.numel() for _, s in _layout(plan, src))
        bufs[src] = torch.empty(numel * kinds)
        ops.append(dist.P2POp(dist.irecv, bufs[src], ranks[src], group))
    if device in hold:
        ops.append(dist.P2POp(dist.isend, out, ranks[hold[device]], group))
    for w in dist.batch_isend_irecv(ops) if ops else []:
        w.wait()
    own = _unpack(plan, device, out, kinds, at)
    return own, {src: _unpack(plan, src, buf, kinds, at) for src, buf in bufs.items()}


class Keeper:
    """The snapshots one member keeps in a generation, refreshed on a side thread. `group`: a gloo
    group over the generation's members, for this alone. `kept`: tag -> (this device's own copy,
    {source device: Holding}) of the two newest exchanges that completed (an older tag is what a
    rollback by one iteration restores, `adapt/rollback.py`)."""

    def __init__(self, plan: Plan, device: int, ranks: dict[int, int], group) -> None:
        self.plan, self.device, self.ranks, self.group = plan, device, ranks, group
        self.kept: dict[int, tuple[Holding, dict[int, Holding]]] = {}
        self.thread: threading.Thread | None = None
        self.flight: tuple[int, dict] | None = None  # (tag, its outcome) of the exchange in flight
        self.busy_s = 0.0  # the side thread's seconds, summed (copy + exchange)
        self.waited_s = 0.0  # the main thread's seconds waiting for it since the last `take_wait`

    def refresh(self, holding: Holding, at: int) -> None:
        """Exchange `holding` (the committed state before iteration `at`; its tensors may be the
        worker's own: they must not change before `settle`) on the side thread."""
        self.settle()
        outcome: dict = {}

        def work() -> None:
            t0 = time.perf_counter()
            try:
                outcome["got"] = exchange(self.plan, self.device, self.ranks, holding, at, self.group)
            except RuntimeError:  # a peer died mid-exchange: this tag is not kept (never a stale copy)
                pass
            finally:
                self.busy_s += time.perf_counter() - t0

        self.flight = (at, outcome)
        self.thread = threading.Thread(target=work, name="snapshot", daemon=True)
        self.thread.start()

    def settle(self) -> bool:
        """Wait for the exchange in flight, if any; False when a death interrupted it (True when it
        completed: its tag is kept, the oldest of three dropped)."""
        if self.thread is None:
            return True
        t0 = time.perf_counter()
        self.thread.join()
        self.waited_s += time.perf_counter() - t0
        (at, outcome), self.thread, self.flight = self.flight, None, None
        if "got" not in outcome:
            return False
        self.kept[at] = outcome["got"]
        for old in sorted(self.kept)[:-2]:
            del self.kept[old]
        return True

    def newest(self) -> int | None:
        """Wait for the exchange in flight; the newest tag kept complete (None: none)."""
        self.settle()
        return max(self.kept, default=None)

    def take_wait(self) -> float:
        """The main thread's seconds waiting for the side thread since the last call."""
        waited, self.waited_s = self.waited_s, 0.0
        return waited
