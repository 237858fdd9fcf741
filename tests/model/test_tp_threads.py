"""TP ranks as threads: the runtime's own TP collectives (`tp_callables`) on an in-process all-reduce."""

import threading

import torch

from resihp.core.model_spec import model_preset
from resihp.core.workload import Workload
from resihp.model import build_stage, gather_state, identity, init_state, microbatch_loss, sync_tp_grads
from resihp.runtime import OptimConfig
from resihp.runtime.exec.collectives import CommClock, tp_callables
from resihp.runtime.exec.data import iteration_microbatches
from resihp.runtime.exec.optim import build_optimizer

LR = 1e-2


class ThreadGroup:
    """A sum all-reduce among `size` threads (rank order, so every rank gets identical bits)."""

    def __init__(self, size: int) -> None:
        self.barrier = threading.Barrier(size, timeout=60)
        self.slots: list = [None] * size

    def all_reduce(self, rank: int, t: torch.Tensor) -> torch.Tensor:
        self.slots[rank] = t.detach().clone()
        self.barrier.wait()
        total = sum(self.slots[1:], self.slots[0].clone())
        self.barrier.wait()
        return total


def thread_all_reduce(t: torch.Tensor, group) -> None:
    """The in-place sum `tp_callables` expects, over a (ThreadGroup, rank) handle."""
    shared, rank = group
    t.copy_(shared.all_reduce(rank, t))


def _run_ranks(fn, size):
    results, errors = [None] * size, []

    def target(rank):
        try:
            results[rank] = fn(rank)
        except BaseException as exc:  # re-raised below with the rank in the message
            errors.append((rank, exc))

    threads = [threading.Thread(target=target, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        rank, exc = errors[0]
        raise RuntimeError(f"rank {rank} failed: {exc!r}") from exc
    return results


def _train_step(model, mbs, n_mb, seq_len, **collectives):
    opt = build_optimizer(model.named_parameters(), OptimConfig(lr=LR))
    total = 0.0
    for mb in mbs:
        logits = model(mb.input_ids, mb.segment_ids, mb.positions, **collectives)  # (N, V)
        loss, _ = microbatch_loss(logits, mb.target_ids, n_mb, seq_len)
        loss.backward()
        total += loss.item()
    return opt, total


def test_tp1_needs_no_collectives():
    assert tp_callables(None, CommClock(), all_reduce=thread_all_reduce) == (identity, identity)


def test_threaded_tp_step_equals_full_step():
    """Uneven GQA TP with the runtime's f/g collectives, grad sync and sharded AdamW reproduces the
    unsharded step."""
    spec, tp_split, ffn_split = model_preset("tiny-gqa"), (2, 3, 1), (100, 80, 76)
    wl = Workload(seq_len=64, num_microbatches=1, lengths="pystdlib", seed=2)
    mbs = iteration_microbatches(wl, 0, 2)
    state = init_state(spec, seed=4)
    full = build_stage(spec, state=state)
    opt, full_loss = _train_step(full, mbs, 2, 64)
    full_grads = {n: p.grad.clone() for n, p in full.named_parameters()}
    opt.step()
    group = ThreadGroup(len(tp_split))

    def rank_fn(r):
        torch.set_num_threads(1)
        model = build_stage(spec, None, tp_split, ffn_split, r, state=state)
        clock = CommClock()
        enter, reduce = tp_callables((group, r), clock, all_reduce=thread_all_reduce)
        opt, loss = _train_step(model, mbs, 2, 64, enter=enter, reduce=reduce)
        assert clock.comm_s > 0  # every f/g collective ran inside the clock
        grads = {n: p.grad for n, p in model.named_parameters()}
        sync_tp_grads(spec, grads, tp_split, ffn_split, r, lambda t: t.copy_(group.all_reduce(r, t)))
        synced = {n: g.clone() for n, g in grads.items()}
        opt.step()
        return loss, synced, {n: p.detach().clone() for n, p in model.named_parameters()}

    results = _run_ranks(rank_fn, len(tp_split))
    for loss, _, _ in results:
        assert abs(loss - full_loss) < 1e-5
    got = gather_state(spec, [res[1] for res in results], tp_split, ffn_split, mode="copy")
    for name, grad in full_grads.items():
        torch.testing.assert_close(got[name], grad, atol=1e-5, rtol=0, msg=name)
    # Adam's first step is ~lr * sign(grad): fp noise in near-zero gradients can move an element by a
    # fraction of lr, so parameters are compared at a tolerance relative to lr.
    got = gather_state(spec, [res[2] for res in results], tp_split, ffn_split, mode="copy")
    for name, param in full.named_parameters():
        torch.testing.assert_close(got[name], param.detach(), atol=0.05 * LR, rtol=0, msg=name)
