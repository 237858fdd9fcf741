"""One device's executor: its stage's TP shard, its AdamW state, and its compiled instruction list.

Semantics of the primitives (`resihp.core.program`), per micro-batch (src, j) at stage i:

* F: forward of the stage shard (TP collectives inside, via `enter`/`reduce`); the last stage also
  computes the micro-batch loss `sum CE / (G * seq_len)` (`resihp.model.loss`).
* B: input gradient. Under zbh1 only d(loss)/d(x) (graph kept for W); under gpipe/1f1b B computes
  input and weight gradients in one backward and W is a no-op — equivalent, because those
  schedules send the gradient upstream only after W.
* W: weight gradients (zbh1), accumulated into `.grad`.
* SEND/RECV: activations and input gradients are replicated over a TP group, so any member may
  send them. `p2p = "root"`: TP rank 0 sends the whole (N, h) tensor to the peer's TP rank 0,
  which broadcasts it in its TP group. `p2p = "chunked"` (ResiHP's rule): the tensor is cut into
  n = min(tp_send, tp_recv) row blocks, rank r < n sends block r to the peer's rank r (n links in
  parallel), and the receivers broadcast their blocks in their TP group. Global-rank P2P on the
  default group; sends are `isend`s waited before ALLREDUCE. Exact for any pair of TP sizes. Each
  block travels with its send time (2 extra fp32 elements), from which the receiver applies the
  link model (`_transfer`) and records the block's transfer time (the trace's `links`).
* ALLREDUCE: per gradient segment the instruction names (`resihp.core.segments`), in layer order.
  Sharded (all holders split the segment alike): TP sum of the partial entries
  (`sync_tp_grads`), then an all-reduce of the shard over the devices of equal TP rank. Full:
  every device writes its contribution into the unsharded layout (TP-partial entries added,
  whole-model entries by TP rank 0 only), one all-reduce sums TP partials and DP replicas at once,
  and each device slices its shard back out — correct for replicas with different TP splits or
  layer partitions. The bytes handed to these all-reduces are counted (`allreduce_bytes`).
* STEP: the tied embedding's gradients summed and the global gradient norm's clipping factor
  (`exec/step.py`), the commit point, the schedule's learning rate for the iteration
  (`optim.learning_rate`) and AdamW on the shard (element-wise, so shard steps equal the
  full-model step).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from resihp.core.plan import Plan
from resihp.core.program import Instr, compile_plan
from resihp.core.schedule import get_schedule
from resihp.core.segments import GradSegment
from resihp.core.trace_format import COMPUTE_OPS, InstrRow, LinkRow, LossRow
from resihp.model import (
    build_stage,
    full_shape,
    gather_tensor,
    layer_param_names,
    slice_tensor,
    sync_tp_grads,
)
from resihp.model.loss import microbatch_loss

from .collectives import CommClock, tp_callables
from .data import build_microbatch
from .groups import Groups
from .iteration import Hooks, Iteration
from .optim import build_optimizer, owned_names, set_learning_rate
from .step import clipping_scale, tie_embedding_grads


def _tag(src: int, mb: int, what: str) -> int:
    return (src * 100_000 + mb) * 2 + (what == "grad")


class Worker:
    """Executes `compile_plan(plan).instructions(device)` once per iteration (`run_iteration`);
    holds what lasts across iterations — the stage shard, its optimizer, its groups and hooks —
    and, while an iteration runs, its `Iteration` (`now`)."""

    def __init__(
        self, plan: Plan, device: int, groups: Groups, job, init=None, hooks: Hooks | None = None
    ) -> None:
        """`init` (a `transfer.StageInit`): start from transferred full tensors instead of the seed;
        `hooks`: the elastic runtime's (None: inert)."""
        self.plan, self.device, self.groups, self.job = plan, device, groups, job
        self.hooks = Hooks() if hooks is None else hooks
        self.spec, self.workload = job.spec, job.workload
        self.instrs = compile_plan(plan).instructions(device)
        self.replica, self.stage_index = plan.stage_of(device)
        st = plan.replicas[self.replica][self.stage_index]
        self.stage = st
        self.model = build_stage(
            self.spec, st.layers, st.tp_split, st.ffn_split, groups.tp_rank, **self._source(init)
        )
        self.named = dict(self.model.named_parameters())
        self.params = list(self.named.values())
        self.opt = build_optimizer(self.named.items(), job.optim)
        if init is not None and init.moments is not None:
            for n, p in self.named.items():
                self.opt.state[p] = {
                    "step": torch.tensor(float(init.steps)),
                    **{
                        k: slice_tensor(self.spec, n, full[n], st.tp_split, st.ffn_split, groups.tp_rank)
                        for k, full in zip(("exp_avg", "exp_avg_sq"), init.moments)
                    },
                }
        self.G = plan.global_microbatches
        self.clock = CommClock(job.timing)
        self.enter, self.reduce = tp_callables(groups.tp_group, self.clock)
        self.split_bw = get_schedule(plan.schedule).split_bw
        self.now: Iteration | None = None
        segments = [seg for ins in self.instrs if ins.op == "ALLREDUCE" for seg in ins.segments]
        full = any(not seg.sharded for seg in segments)
        self._zero_shards = {n: self._zeros(n) for n in self.named} if full else {}
        self.norm_names = owned_names(plan, self.replica, self.stage_index) if job.optim.grad_clip else []

    def _source(self, init) -> dict:
        """What the stage starts from: transferred tensors, this shard's slices of the job's
        Hugging Face weights (`model.hf.read_shard`: nothing else is read), or the seed."""
        if init is not None:
            return {"state": init.params}
        if self.job.weights is not None:
            from resihp.model.hf import read_shard

            st = self.stage
            return {"shard": read_shard(self.job.weights, self.spec, st.layers, st.tp_split, st.ffn_split,
                                        self.groups.tp_rank)}  # fmt: skip
        return {"seed": self.job.seed}

    def _zeros(self, name: str) -> list[torch.Tensor]:
        full = torch.zeros(full_shape(self.spec, name))
        st = self.stage
        return [slice_tensor(self.spec, name, full, st.tp_split, st.ffn_split, r) for r in range(st.tp)]

    # ------------------------------------------------------------------ one iteration
    def run_iteration(self, it: int) -> dict:
        """Run the instruction list for iteration `it`; returns this device's trace record."""
        hooks, clock = self.hooks, self.clock
        now = self.now = Iteration(it, self.workload.pack(it, self.G), hooks.slow(it), hooks.link(it), 0.0)
        clock.comm_s = 0.0
        try:
            now.t_start, cpu_start = time.perf_counter(), time.process_time()
            for ins in self.instrs:
                if clock.enabled or now.slow < 1.0:
                    t0, c0 = time.perf_counter(), clock.comm_s
                getattr(self, "_" + ins.op)(ins)
                if now.slow < 1.0 and ins.op in COMPUTE_OPS:  # injected slowdown: t -> t / p
                    t = time.perf_counter() - t0 - (clock.comm_s - c0)
                    time.sleep(max(t, 0.0) * (1.0 / now.slow - 1.0))
                if clock.enabled:
                    wall, comm = time.perf_counter() - t0, clock.comm_s - c0
                    now.rows.append(InstrRow(ins.op, ins.src, ins.mb, round(wall - comm, 7), round(comm, 7)))
            wall, cpu = time.perf_counter() - now.t_start, time.process_time() - cpu_start
        finally:
            self.now = None
        return {
            "iter": it,
            "generation": self.plan.generation,
            "device": self.device,
            "replica": self.replica,
            "stage": self.stage_index,
            "tp_rank": self.groups.tp_rank,
            "wall_s": wall,
            "cpu_s": cpu,
            "compute_s": sum(r.compute_s for r in now.rows),
            "comm_s": sum(r.comm_s for r in now.rows),
            "instrs": now.rows,
            "links": now.transfers,
            "losses": now.losses,
            "allreduce_bytes": now.allreduce_bytes,
            "grad_norm": now.grad_norm,
        }

    def _mb(self, src: int, j: int):
        now, key = self.now, (src, j)
        if key not in now.mbs:
            k = self.plan.mb_offset(src) + j
            now.mbs[key] = build_microbatch(self.workload, now.batch, k, now.it)
        return now.mbs[key]

    # ------------------------------------------------------------------ primitives
    def _F(self, ins: Instr) -> None:
        now, key = self.now, (ins.src, ins.mb)
        mb = self._mb(*key)
        x = mb.input_ids if self.model.is_first else now.acts.pop(key).requires_grad_()
        out = self.model(x, mb.segment_ids, mb.positions, enter=self.enter, reduce=self.reduce)
        if self.model.is_last:
            out, n = microbatch_loss(out, mb.target_ids, self.G, self.workload.seq_len)
            if self.groups.tp_rank == 0:
                now.losses.append(LossRow(self.plan.mb_offset(ins.src) + ins.mb, out.item(), n))
        now.live[key] = [x, out, None]

    def _B(self, ins: Instr) -> None:
        now, key = self.now, (ins.src, ins.mb)
        x, out, _ = entry = now.live[key]
        g = now.grads.pop(key, None)  # None on the last stage: out is the scalar loss
        first = self.model.is_first
        if self.split_bw:
            entry[2] = g
            if not first:
                (now.gx[key],) = torch.autograd.grad(out, [x], g, retain_graph=True)
            return
        inputs = self.params if first else [x, *self.params]
        grads = torch.autograd.grad(out, inputs, g, allow_unused=True)
        if not first:
            now.gx[key], grads = grads[0], grads[1:]
        self._accumulate(grads)
        del now.live[key]

    def _W(self, ins: Instr) -> None:
        if not self.split_bw:
            return
        _, out, g = self.now.live.pop((ins.src, ins.mb))
        self._accumulate(torch.autograd.grad(out, self.params, g, allow_unused=True))

    def _accumulate(self, grads) -> None:
        for p, g in zip(self.params, grads):
            if g is not None:
                p.grad = g if p.grad is None else p.grad.add_(g)

    def _links(self, peer: tuple[int, int]) -> int:
        """Number of parallel P2P links to the peer stage: 1 (root to root) or min of the TP sizes."""
        if self.job.p2p == "root":
            return 1
        return min(self.stage.tp, self.plan.replicas[peer[0]][peer[1]].tp)

    def _RECV(self, ins: Instr) -> None:
        buf = torch.empty(self.workload.seq_len, self.spec.hidden)  # (N, h)
        n, rank = self._links(ins.peer), self.groups.tp_rank
        chunks = torch.tensor_split(buf, n)  # contiguous row blocks of buf
        with self.clock.comm():
            if rank < n:
                chunk = chunks[rank]
                msg = torch.empty(chunk.numel() + 2)  # (N/n·h + 2,): the block, then its send time
                src = self.groups.rank_of(*ins.peer, rank)
                posted = time.perf_counter()
                dist.recv(msg, src=src, tag=_tag(ins.src, ins.mb, ins.what))
                chunk.copy_(msg[:-2].view_as(chunk))
                peer = self.plan.replicas[ins.peer[0]][ins.peer[1]].devices[rank]
                sent = float(msg[-2]) + float(msg[-1])
                self._transfer(peer, ins, sent, posted, chunk.numel() * chunk.element_size())
            if self.groups.tp_group is not None:
                for r in range(n):
                    dist.broadcast(
                        chunks[r],
                        src=self.groups.rank_of(self.replica, self.stage_index, r),
                        group=self.groups.tp_group,
                    )
        (self.now.acts if ins.what == "act" else self.now.grads)[(ins.src, ins.mb)] = buf

    def _transfer(self, peer: int, ins: Instr, sent: float, posted: float, nbytes: int) -> None:
        """The link model of a received block (docs/runtime.md, "Fault injection"): the transfer
        starts when both ends are ready (`start` = max(send time, recv posted); one clock, as
        `perf_counter` is CLOCK_MONOTONIC, system-wide on Linux) and lasts max(measured, nbytes /
        `job.link_mb_per_s`) / f, f the injected link factor (1 when healthy): the receiver sleeps
        until then. Records the block's `LinkRow` in the iteration's `transfers`."""
        start = max(sent, posted)
        bw = self.job.link_mb_per_s * 1e6
        wire = max(time.perf_counter() - start, nbytes / bw if bw > 0 else 0.0)
        wire /= self.now.link.get(peer, 1.0)
        delay = start + wire - time.perf_counter()
        if delay > 0.0:
            time.sleep(delay)
        if self.clock.enabled:
            took = round(time.perf_counter() - start, 7)
            self.now.transfers.append(LinkRow(peer, self.device, ins.what, ins.src, ins.mb, nbytes, took))

    def _SEND(self, ins: Instr) -> None:
        now, key = self.now, (ins.src, ins.mb)
        t = now.live[key][1] if ins.what == "act" else now.gx.pop(key)
        n, rank = self._links(ins.peer), self.groups.tp_rank
        if rank >= n:
            return
        block = torch.tensor_split(t.detach(), n)[rank]  # (N/n, h)
        with self.clock.comm():
            sent = time.perf_counter()
            hi = float(torch.tensor(sent, dtype=torch.float32))  # the send time, exact in two fp32
            msg = torch.cat([block.reshape(-1), torch.tensor([hi, sent - hi])])  # (N/n·h + 2,)
            dst = self.groups.rank_of(*ins.peer, rank)
            work = dist.isend(msg, dst=dst, tag=_tag(ins.src, ins.mb, ins.what))
        now.sends.append((work, msg))

    def _segment_names(self, seg: GradSegment) -> list[str]:
        names = ["embed.weight"] if seg.with_embedding else []
        for k in range(*seg.layers):
            names += layer_param_names(self.spec, k)
        if seg.with_head:
            names += ["norm.weight", "lm_head.weight"]
        return names

    def _ALLREDUCE(self, ins: Instr) -> None:
        now = self.now
        with self.clock.comm():  # sends still in flight count as communication of this step
            for work, _ in now.sends:
                work.wait()
        now.sends.clear()
        if not now.reducing:
            now.reducing = True
            if self.hooks.on_allreduce is not None:
                self.hooks.on_allreduce(now.it)
        for seg in ins.segments:
            names = self._segment_names(seg)
            for n in names:  # a replica without micro-batches still steps (with zero gradients)
                if self.named[n].grad is None:
                    self.named[n].grad = torch.zeros_like(self.named[n])
            group = self.groups.reduction_group(seg)
            if seg.sharded:
                self._reduce_shards(names, group)
            else:
                self._reduce_full(names, group)

    def _reduce_shards(self, names: list[str], group) -> None:
        """Equal TP splits everywhere: TP-sum the partial entries, then all-reduce shards over DP."""
        st, rank = self.stage, self.groups.tp_rank
        grads = {n: self.named[n].grad for n in names}
        tp_group = self.groups.tp_group

        def tp_sum(t: torch.Tensor) -> None:
            with self.clock.comm():
                dist.all_reduce(t, group=tp_group)

        sync_tp_grads(self.spec, grads, st.tp_split, st.ffn_split, rank, tp_sum)
        if group is None:
            return
        flat = torch.cat([g.reshape(-1) for g in grads.values()])
        with self.clock.comm():
            dist.all_reduce(flat, group=group)
        self.now.allreduce_bytes += flat.numel() * flat.element_size()
        offset = 0
        for g in grads.values():
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def _reduce_full(self, names: list[str], group) -> None:
        """Different TP splits: reduce in the full layout (TP partials and DP replicas at once)."""
        st, rank = self.stage, self.groups.tp_rank
        parts = []
        for n in names:
            shards = list(self._zero_shards[n])
            shards[rank] = self.named[n].grad
            full = gather_tensor(self.spec, n, shards, st.tp_split, st.ffn_split, "sum")
            parts.append(full.reshape(-1))
        flat = torch.cat(parts)
        if group is not None:
            with self.clock.comm():
                dist.all_reduce(flat, group=group)
            self.now.allreduce_bytes += flat.numel() * flat.element_size()
        offset = 0
        for n in names:
            shape = full_shape(self.spec, n)
            numel = int(torch.Size(shape).numel())
            full = flat[offset : offset + numel].view(shape)
            offset += numel
            self.named[n].grad = slice_tensor(self.spec, n, full, st.tp_split, st.ffn_split, rank)

    def _STEP(self, ins: Instr) -> None:
        now, cfg = self.now, self.job.optim
        tie_embedding_grads(self)
        scale = clipping_scale(self)
        if self.hooks.before_step is not None:
            self.hooks.before_step(now.it, now.losses, time.perf_counter() - now.t_start)
        if scale < 1.0:
            for p in self.params:
                if p.grad is not None:
                    p.grad.mul_(scale)
        set_learning_rate(self.opt, cfg, now.it)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def state_numpy(self) -> dict:
        """This shard's parameters as numpy arrays (canonical names)."""
        return {n: p.detach().numpy().copy() for n, p in self.named.items()}
