import pytest
import torch

from resihp.core.model_spec import model_preset
from resihp.core.workload import Workload
from resihp.model import build_stage, init_state, iteration_loss, microbatch_loss
from resihp.runtime import OptimConfig
from resihp.runtime.exec.data import iteration_microbatches
from resihp.runtime.exec.optim import build_optimizer
from resihp.runtime.reference import train_reference


def test_loss_falls_on_pystdlib():
    """Twenty iterations of the tiny model on stdlib bytes lower the loss well below its start."""
    wl = Workload(seq_len=256, num_microbatches=2, lengths="pystdlib", seed=0)
    losses, state = train_reference(model_preset("tiny"), wl, 2, 20, lr=3e-3, seed=0)
    assert len(losses) == 20
    assert 5.0 < losses[0] < 6.0  # ~ln(256) = 5.55 at init
    assert sum(losses[-3:]) / 3 < losses[0] - 1.0
    assert state.keys() == init_state(model_preset("tiny"), 0).keys()


def test_reference_is_deterministic():
    """Two runs with the same arguments give bit-identical losses and final states."""
    spec, wl = model_preset("tiny-gqa"), Workload(seq_len=64, num_microbatches=1, lengths="fixed", doc_len=40)
    a_loss, a_state = train_reference(spec, wl, 2, 2, lr=1e-3, seed=1)
    b_loss, b_state = train_reference(spec, wl, 2, 2, lr=1e-3, seed=1)
    assert a_loss == b_loss
    assert all(torch.equal(a_state[n], b_state[n]) for n in a_state)


def _run(model, mbs, order):
    """(gradients, summed losses, targets) of the micro-batches `order`, from zeroed gradients."""
    model.zero_grad()
    total, targets = 0.0, 0
    for k in order:
        mb = mbs[k]
        logits = model(mb.input_ids, mb.segment_ids, mb.positions)  # (N, V)
        loss, n = microbatch_loss(logits, mb.target_ids, len(mbs), 64)
        loss.backward()
        total, targets = total + loss.item(), targets + n
    return [p.grad.clone() for p in model.parameters()], total, targets


def test_gradient_does_not_depend_on_microbatch_placement():
    """One replica running all micro-batches and two replicas summing their gradients agree."""
    spec, wl = model_preset("tiny"), Workload(seq_len=64, num_microbatches=1, lengths="fixed", doc_len=24)
    mbs = iteration_microbatches(wl, 0, 4)
    model = build_stage(spec, seed=0)
    whole, total, targets = _run(model, mbs, [0, 1, 2, 3])
    left, right = _run(model, mbs, [3, 1])[0], _run(model, mbs, [0, 2])[0]
    for g, a, b in zip(whole, left, right):
        torch.testing.assert_close(a + b, g, atol=1e-6, rtol=1e-5)
    with torch.no_grad():
        logits = torch.cat([model(m.input_ids, m.segment_ids, m.positions) for m in mbs])
    mean_ce = torch.nn.functional.cross_entropy(logits, torch.cat([m.target_ids for m in mbs]))
    assert iteration_loss(total, 4, 64, targets) == pytest.approx(mean_ce.item(), rel=1e-5)


def test_optimizer_decays_matrices_only():
    """AdamW decays 2-D weights only, with the OptimConfig hyper-parameters."""
    model = build_stage(model_preset("tiny"), (0, 1), seed=0)
    cfg = OptimConfig(lr=2e-3, weight_decay=0.05)
    opt = build_optimizer(model.named_parameters(), cfg)
    decayed, plain = opt.param_groups
    assert decayed["weight_decay"] == 0.05 and plain["weight_decay"] == 0.0
    assert all(p.ndim == 2 for p in decayed["params"]) and all(p.ndim == 1 for p in plain["params"])
    assert decayed["lr"] == 2e-3 and decayed["betas"] == cfg.betas
    with pytest.raises(ValueError, match="optim.lr"):
        OptimConfig(lr=-1e-3)  # lr = 0 is allowed: parameters that never move (an export round trip)
