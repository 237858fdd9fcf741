"""Activation checkpointing per transformer block changes memory, not results (1e-6)."""

import torch

from resihp.core.model_spec import model_preset
from resihp.core.workload import Workload
from resihp.model import build_stage, init_state, microbatch_loss
from resihp.runtime.exec.data import iteration_microbatches


def _grads(spec, state, checkpointing: bool, split: bool, layers=None):
    """(loss, input gradient or None, parameter gradients) of one micro-batch; `split`: zbh1's two
    backward passes (input gradient with the graph kept, then the weights)."""
    model = build_stage(spec, layers, state=state)
    model.activation_checkpointing = checkpointing
    mb = iteration_microbatches(Workload(64, 1, "pystdlib", 0), 0, 1)[0]
    x = mb.input_ids
    if layers is not None and layers[0] > 0:  # a later stage: a hidden-state input
        x = torch.randn(64, spec.hidden, generator=torch.Generator().manual_seed(5)).requires_grad_()
    out = model(x, mb.segment_ids, mb.positions)
    loss = microbatch_loss(out, mb.target_ids, 1, 64)[0] if model.is_last else out.square().mean()
    params = list(model.parameters())
    if split and x.requires_grad:
        (gx,) = torch.autograd.grad(loss, [x], retain_graph=True)
        gp = torch.autograd.grad(loss, params)
    else:
        inputs = [x, *params] if x.requires_grad else params
        g = torch.autograd.grad(loss, inputs)
        gx, gp = (g[0], g[1:]) if x.requires_grad else (None, g)
    return loss.detach(), gx, gp


def test_checkpointed_blocks_give_the_same_loss_and_gradients():
    """Whole model and a middle stage, one backward and the split B/W backward: equal within 1e-6."""
    spec = model_preset("tiny-gqa")
    state = init_state(spec, 1)
    for layers in (None, (2, 5)):
        for split in (False, True):
            plain = _grads(spec, state, False, split, layers)
            ckpt = _grads(spec, state, True, split, layers)
            torch.testing.assert_close(ckpt[0], plain[0], atol=1e-6, rtol=0)
            if plain[1] is not None:
                torch.testing.assert_close(ckpt[1], plain[1], atol=1e-6, rtol=0)
            for a, b in zip(ckpt[2], plain[2]):
                torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_checkpointing_keeps_fewer_activations():
    """The saved tensors of a checkpointed forward are fewer than without (what it is for)."""
    spec = model_preset("tiny-gqa")
    state = init_state(spec, 1)
    counts = []
    for checkpointing in (False, True):
        model = build_stage(spec, state=state)
        model.activation_checkpointing = checkpointing
        saved: list[int] = []

        def pack(t, saved=saved):
            saved.append(t.numel())
            return t

        ids = torch.randint(0, 256, (64,), generator=torch.Generator().manual_seed(0))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(ids, torch.zeros(64, dtype=torch.long), torch.arange(64))
        counts.append(sum(saved))
    assert counts[1] < counts[0] / 2, counts
