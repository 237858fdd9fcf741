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
  default group, without tags: blocks are matched by posting order, and each run of consecutive
  SEND/RECV instructions is posted as one batch at its first instruction (`p2p.py`, `pipe.py`);
  sends are waited before ALLREDUCE. Exact for any pair of TP sizes. Send times travel with a
  block only for the link model or a link fault (`pipe.py`).
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

Device backend (`device.py`): the stage, its optimizer state, micro-batches and every buffer live on
the member's device (`dev`); the forward runs in the job's precision (bf16 autocast or fp32) and, with
`job.activation_checkpointing`, recomputes each block in the backward. Per instruction the clock
(`CommClock`: CPU time, or CUDA events) marks its span and its collectives' spans; on CUDA the marks
are read once, after the device is synchronised at STEP. Injected slowness is device work
(`slow.py`), after every F, B and W that did work.
"""

from __future__ import annotations

import functools
import time

import torch
import torch.distributed as dist

from resihp.core.plan import Plan
from resihp.core.program import Instr, compile_plan
from resihp.core.schedule import get_schedule
from resihp.core.segments import GradSegment
from resihp.core.trace_format import COMPUTE_OPS, InstrRow, LossRow
from resihp.model import (
    Docs,
    build_stage,
    full_shape,
    gather_tensor,
    layer_param_names,
    slice_tensor,
    sync_tp_grads,
)
from resihp.model.loss import microbatch_loss

from .collectives import CommClock, tp_callables
from .data import MicroBatch, build_microbatch
from .device import compute_precision, member_device, synchronize
from .groups import Groups
from .iteration import Hooks, Iteration
from .optim import build_optimizer, owned_names, set_learning_rate
from .pipe import Pipe
from .slow import Slowdown
from .step import clipping_scale, tie_embedding_grads


class Worker:
    """Executes `compile_plan(plan).instructions(device)` once per iteration (`run_iteration`);
    holds what lasts across iterations — the stage shard, its optimizer, its groups and hooks —
    and, while an iteration runs, its `Iteration` (`now`)."""

    def __init__(
        self, plan: Plan, device: int, groups: Groups, job, init=None, hooks: Hooks | None = None
    ) -> None:
        """`init` (a `transfer.StageInit`): start from transferred tensors instead of the seed;
        `hooks`: the elastic runtime's (None: inert)."""
        self.plan, self.device, self.groups, self.job = plan, device, groups, job
        self.hooks = Hooks() if hooks is None else hooks
        self.spec, self.workload = job.spec, job.workload
        self.dev = member_device(job, device)
        program = compile_plan(plan)
        self.instrs = program.instructions(device)
        self.replica, self.stage_index = plan.stage_of(device)
        st = plan.replicas[self.replica][self.stage_index]
        self.stage = st
        self.model = build_stage(
            self.spec, st.layers, st.tp_split, st.ffn_split, groups.tp_rank, **self._source(init)
        )
        self.model.to(self.dev)
        self.model.activation_checkpointing = job.activation_checkpointing
        self.named = dict(self.model.named_parameters())
        self.params = list(self.named.values())
        self.opt = build_optimizer(self.named.items(), job.optim)
        if init is not None and init.moments is not None:
            for n, p in self.named.items():
                self.opt.state[p] = {
                    "step": torch.tensor(float(init.steps)),  # on the host, as AdamW keeps it
                    **{k: self._moment(init, n, t) for k, t in zip(("exp_avg", "exp_avg_sq"), init.moments)},
                }
        self.G = plan.global_microbatches
        self.clock = CommClock(job.timing, self.dev)
        self.precision = functools.partial(compute_precision, job, self.dev)  # (no cycle through self)
        self.pipe = Pipe(self, program)
        self.slowdown = Slowdown(self.clock, self.dev)
        self.enter, self.reduce = tp_callables(groups.tp_group, self.clock)
        self.split_bw = get_schedule(plan.schedule).split_bw
        self.now: Iteration | None = None
        segments = [seg for ins in self.instrs if ins.op == "ALLREDUCE" for seg in ins.segments]
        full = any(not seg.sharded for seg in segments)
        self._zero_shards = {n: self._zeros(n) for n in self.named} if full else {}
        self.norm_names = owned_names(plan, self.replica, self.stage_index) if job.optim.grad_clip else []

    def _moment(self, init, name: str, tensors) -> torch.Tensor:
        """This shard's AdamW moment `name` from `init`: an own copy (the optimizer updates it in
        place, and a transferred shard may be the member's held state, a later transfer's source)."""
        if init.sharded:
            return tensors[name].to(self.dev, copy=True)
        st = self.stage
        return slice_tensor(
            self.spec, name, tensors[name], st.tp_split, st.ffn_split, self.groups.tp_rank
        ).to(self.dev)

    def _source(self, init) -> dict:
        """What the stage starts from: transferred tensors, this shard's slices of the job's
        Hugging Face weights (`model.hf.read_shard`: nothing else is read), or the seed."""
        if init is not None:
            return {"shard": init.params} if init.sharded else {"state": init.params}
        if self.job.weights is not None:
            from resihp.model.hf import read_shard

            st = self.stage
            return {"shard": read_shard(self.job.weights, self.spec, st.layers, st.tp_split, st.ffn_split,
                                        self.groups.tp_rank)}  # fmt: skip
        return {"seed": self.job.seed}

    def _zeros(self, name: str) -> list[torch.Tensor]:
        full = torch.zeros(full_shape(self.spec, name), device=self.dev)
        st = self.stage
        return [slice_tensor(self.spec, name, full, st.tp_split, st.ffn_split, r) for r in range(st.tp)]

    # ------------------------------------------------------------------ one iteration
    def run_iteration(self, it: int) -> dict:
        """Run the instruction list for iteration `it`; returns this device's trace record."""
        hooks, clock, posts = self.hooks, self.clock, self.pipe.posts
        now = self.now = Iteration(it, self.workload.pack(it, self.G), hooks.slow(it), hooks.link(it), 0.0)
        clock.reset()
        slow = now.slow < 1.0
        try:
            now.t_start, cpu_start = time.perf_counter(), time.process_time()
            for k, ins in enumerate(self.instrs):
                if clock.enabled or slow:
                    start = clock.mark()
                if k in posts:
                    with clock.comm():
                        self.pipe.post(posts[k], now)
                worked = getattr(self, "_" + ins.op)(ins)
                if slow and ins.op in COMPUTE_OPS and worked is not False:  # injected slowdown: t -> t / p
                    self.slowdown.after(k, start, now.slow)
                if clock.enabled:
                    now.marks.append((k, start, clock.mark()))
            assert not now.inbox, f"device {self.device}: blocks posted but never received: {list(now.inbox)}"
            synchronize(self.dev)  # its second wait for the device (STEP waited first): the optimizer
            wall, cpu = time.perf_counter() - now.t_start, time.process_time() - cpu_start
            rows = self._rows(now)
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
            "compute_s": sum(r.compute_s for r in rows),
            "comm_s": sum(r.comm_s for r in rows),
            "instrs": rows,
            "links": now.transfers,
            "losses": now.losses,
            "allreduce_bytes": now.allreduce_bytes,
            "grad_norm": now.grad_norm,
        }

    def _rows(self, now: Iteration) -> list[InstrRow]:
        """The trace's `instrs` from the iteration's marks (device work is done: events are readable);
        also what the slowdown learns of each instruction's compute time."""
        rows = []
        for k, a, b in now.marks:
            ins = self.instrs[k]
            wall, comm = self.clock.split(a, b)
            rows.append(InstrRow(ins.op, ins.src, ins.mb, round(wall - comm, 7), round(comm, 7)))
            if self.clock.cuda and ins.op in COMPUTE_OPS:
                self.slowdown.learn(k, max(wall - comm, 0.0), now.slow)
        return rows

    def _mb(self, src: int, j: int) -> tuple[MicroBatch, Docs, int]:
        """Micro-batch (src, j) on the device, its documents and target count (read on the host)."""
        now, key = self.now, (src, j)
        if key not in now.mbs:
            k = self.plan.mb_offset(src) + j
            mb = build_microbatch(self.workload, now.batch, k, now.it)
            docs, targets = Docs.of(mb.segment_ids), mb.num_targets
            if self.dev.type != "cpu":
                mb = MicroBatch(*(t.to(self.dev, non_blocking=True) for t in vars(mb).values()))
            now.mbs[key] = (mb, docs, targets)
        return now.mbs[key]

    # ------------------------------------------------------------------ primitives
    def _F(self, ins: Instr) -> None:
        now, key = self.now, (ins.src, ins.mb)
        mb, docs, targets = self._mb(*key)
        x = mb.input_ids if self.model.is_first else now.acts.pop(key).requires_grad_()
        with self.precision():
            out = self.model(x, mb.segment_ids, mb.positions, docs=docs, enter=self.enter, reduce=self.reduce)
        if self.model.is_last:
            out, n = microbatch_loss(out, mb.target_ids, self.G, self.workload.seq_len, targets)
            if self.groups.tp_rank == 0:  # read at STEP, all at once
                now.losses.append(LossRow(self.plan.mb_offset(ins.src) + ins.mb, out.detach(), n))
        now.live[key] = [x, out, None]

    def _B(self, ins: Instr) -> bool:
        """False (no work done) under zbh1 on the first stage: no input to take a gradient of."""
        now, key = self.now, (ins.src, ins.mb)
        x, out, _ = entry = now.live[key]
        g = now.grads.pop(key, None)  # None on the last stage: out is the scalar loss
        first = self.model.is_first
        if self.split_bw:
            entry[2] = g
            if first:
                return False
            (now.gx[key],) = torch.autograd.grad(out, [x], g, retain_graph=True)
            return True
        inputs = self.params if first else [x, *self.params]
        grads = torch.autograd.grad(out, inputs, g, allow_unused=True)
        if not first:
            now.gx[key], grads = grads[0], grads[1:]
        self._accumulate(grads)
        del now.live[key]
        return True

    def _W(self, ins: Instr) -> bool:
        """Weight gradients under zbh1; False (no work done) under gpipe / 1f1b, where B made them."""
        if not self.split_bw:
            return False
        _, out, g = self.now.live.pop((ins.src, ins.mb))
        self._accumulate(torch.autograd.grad(out, self.params, g, allow_unused=True))
        return True

    def _accumulate(self, grads) -> None:
        for p, g in zip(self.params, grads):
            if g is not None:
                p.grad = g if p.grad is None else p.grad.add_(g)

    def _RECV(self, ins: Instr) -> None:
        self.pipe.recv(ins, self.now)

    def _SEND(self, ins: Instr) -> None:
        """Nothing left to do: the block was posted with its run (`pipe.post`)."""

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
            for works, _ in now.sends:
                for work in works:
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
        if now.losses:  # every micro-batch loss of the iteration, read in one transfer
            values = torch.stack([row.loss for row in now.losses]).tolist()
            now.losses = [row._replace(loss=v) for row, v in zip(now.losses, values)]
        tie_embedding_grads(self)
        scale = clipping_scale(self)
        synchronize(self.dev)  # wall time up to STEP covers the device's work
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
        """This shard's parameters as numpy arrays (canonical names), copied to the host."""
        return {n: p.detach().cpu().numpy().copy() for n, p in self.named.items()}
