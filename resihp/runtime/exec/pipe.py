"""A worker's pipeline transfers: posting batches of blocks without tags, receiving, the link model.

What is posted where is `p2p.post_schedule` (matched by order: no tags, so gloo and NCCL run the
same code). A batch is one `dist.batch_isend_irecv` (an NCCL group; on gloo the same isend / irecv
calls one by one). A receive lands in its row block of the (N, h) buffer directly; RECV waits for
it (`Pipe.recv`) and broadcasts the blocks in the receiving TP group. Sends are waited at
ALLREDUCE (`Iteration.sends`).

Send times travel only where they are used: with the link model on (`run.link_mb_per_s` > 0) or a
link fault on the pair in this iteration (`Hooks.link`: both ends read the same faults, so both
agree on the block's size). Such a block carries 2 more fp32 elements, its send time (exact in
two fp32), and the receiver reads them on the host (a sync on CUDA: the link model is a CPU tool)
to apply the link model (`_transfer`) and record the block's `LinkRow`. Without send times there is
no transfer time to record: the trace's `links` stay empty, and `adapt/calibrate.py` then keeps
the base preset's P2P latency (with the link model off it used to fit it to loopback noise).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from resihp.core.program import Instr, Program
from resihp.core.trace_format import LinkRow

from .iteration import Iteration
from .p2p import Post, post_schedule


class Pipe:
    """The P2P side of one worker: what it needs of `worker.Worker` is copied, not referenced (no
    reference cycle: dropping the worker drops its groups at once, `control/member.py`)."""

    def __init__(self, worker, program: Program) -> None:
        self.w = _View(worker)
        self.posts = post_schedule(program, worker.job.p2p, worker.device)

    def _stamped(self, now: Iteration, peer: int) -> bool:
        return self.w.job.link_mb_per_s > 0 or peer in now.link

    def _buffer(self) -> torch.Tensor:
        w = self.w
        return torch.empty(w.workload.seq_len, w.spec.hidden, device=w.dev)  # (N, h) fp32

    def post(self, batch: tuple[Post, ...], now: Iteration) -> None:
        """Post one batch (instruction `k` of `posts`): its sends' blocks and its receive buffers."""
        w = self.w
        ops, entries = [], []
        for p in batch:
            m = p.message
            if p.send:
                key = (m.src, m.mb)
                t = now.live[key][1] if m.what == "act" else now.gx.pop(key)
                block = torch.tensor_split(t.detach(), m.links)[m.rank]  # (N/n, h)
                msg = block.reshape(-1)
                if self._stamped(now, m.receiver):
                    sent = time.perf_counter()
                    hi = float(torch.tensor(sent, dtype=torch.float32))  # the send time, exact in two fp32
                    stamp = torch.tensor([hi, sent - hi], device=w.dev)
                    msg = torch.cat([msg, stamp])  # (N/n·h + 2,)
                elif not msg.is_contiguous():
                    msg = msg.contiguous()
                ops.append(dist.P2POp(dist.isend, msg, w.groups.ranks[m.receiver]))
                entries.append((m, msg))
            else:
                buf = self._buffer()
                chunk = torch.tensor_split(buf, m.links)[m.rank]  # contiguous row block of buf
                stamped = self._stamped(now, m.sender)
                msg = torch.empty(chunk.numel() + 2, device=w.dev) if stamped else chunk
                ops.append(dist.P2POp(dist.irecv, msg, w.groups.ranks[m.sender]))
                entries.append((m, (buf, chunk, msg, stamped)))
        posted = time.perf_counter()
        works = dist.batch_isend_irecv(ops)
        if len(works) != len(ops):  # one work for the whole group (NCCL coalescing)
            works = [works] * len(ops)
        else:
            works = [[x] for x in works]
        for p, (m, what), work in zip(batch, entries, works):
            if p.send:
                now.sends.append((work, what))
            else:
                now.inbox[m.key] = (work, what, posted)

    def recv(self, ins: Instr, now: Iteration) -> None:
        """RECV: wait for this device's block (if it has a link), then the TP broadcast of every
        block from the TP rank that received it; the full (N, h) tensor goes to F or B."""
        w = self.w
        key = (ins.what, ins.src, ins.mb)
        entry = now.inbox.pop(key, None)
        n = self._links(ins.peer)
        with w.clock.comm():
            if entry is None:  # a TP rank without a link: only the broadcast
                buf = self._buffer()
            else:
                works, (buf, chunk, msg, stamped), posted = entry
                for work in works:
                    work.wait()
                if stamped:
                    chunk.copy_(msg[:-2].view_as(chunk))
                    peer = w.plan.replicas[ins.peer[0]][ins.peer[1]].devices[w.groups.tp_rank]
                    sent = float(msg[-2]) + float(msg[-1])
                    self._transfer(now, peer, ins, sent, posted, chunk.numel() * chunk.element_size())
            if w.groups.tp_group is not None:
                chunks = torch.tensor_split(buf, n)
                for r in range(n):
                    dist.broadcast(
                        chunks[r], src=w.groups.rank_of(w.replica, w.stage_index, r), group=w.groups.tp_group
                    )
        (now.acts if ins.what == "act" else now.grads)[(ins.src, ins.mb)] = buf

    def _links(self, peer: tuple[int, int]) -> int:
        w = self.w
        if w.job.p2p == "root":
            return 1
        return min(w.stage.tp, w.plan.replicas[peer[0]][peer[1]].tp)

    def _transfer(
        self, now: Iteration, peer: int, ins: Instr, sent: float, posted: float, nbytes: int
    ) -> None:
        """The link model of a received block (docs/runtime.md, "Fault injection"): the transfer
        starts when both ends are ready (`start` = max(send time, receive posted); one clock, as
        `perf_counter` is CLOCK_MONOTONIC, system-wide on Linux) and lasts max(measured, nbytes /
        `job.link_mb_per_s`) / f, f the injected link factor (1 when healthy): the receiver sleeps
        until then. Records the block's `LinkRow` in the iteration's `transfers`."""
        w = self.w
        start = max(sent, posted)
        bw = w.job.link_mb_per_s * 1e6
        wire = max(time.perf_counter() - start, nbytes / bw if bw > 0 else 0.0)
        wire /= now.link.get(peer, 1.0)
        delay = start + wire - time.perf_counter()
        if delay > 0.0:
            time.sleep(delay)
        if w.clock.enabled:
            took = round(time.perf_counter() - start, 7)
            now.transfers.append(LinkRow(peer, w.device, ins.what, ins.src, ins.mb, nbytes, took))


class _View:
    """The worker's fields the pipe reads (all fixed for the worker's life)."""

    def __init__(self, worker) -> None:
        for name in ("plan", "groups", "job", "dev", "clock", "spec", "workload", "device", "stage"):
            setattr(self, name, getattr(worker, name))
        self.replica, self.stage_index = worker.replica, worker.stage_index
