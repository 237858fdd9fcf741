import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from resihp.core.model_spec import ModelSpec, model_preset
from resihp.model import (
    build_stage,
    gather_state,
    init_state,
    kv_is_replicated,
    kv_range,
    rope_tables,
    segment_mask,
    slice_state,
    sync_tp_grads,
    tp_grad_buffer,
)

BIAS_GQA = ModelSpec("bias-gqa", 2, 64, 8, 2, 96, 256, qkv_bias=True)
CASES = [  # (spec, tp_split, ffn_split): uneven, and GQA with kv groups straddling shards
    (model_preset("tiny"), (3, 3, 2), (60, 60, 56)),
    (model_preset("tiny-gqa"), (2, 2, 2), (100, 80, 76)),
    (model_preset("tiny-gqa"), (4, 1, 1), (1, 200, 55)),
    (BIAS_GQA, (3, 3, 2), (40, 30, 26)),
]
IDS = [f"{s.name}-{t}" for s, t, _ in CASES]


def _inputs(spec, n=40):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(n, spec.hidden, generator=g)  # (N, h)
    seg = torch.tensor([0] * 25 + [1] * (n - 25))
    pos = torch.cat([torch.arange(25), torch.arange(n - 25)])
    cos, sin = rope_tables(pos, spec.head_dim)
    return x, cos, sin, segment_mask(seg)


def _run_tp(spec, state, tp_split, ffn_split, k=1):
    """Full layer k and its shards, the shards combined as TP does (sum of partials, shared input)."""
    full = build_stage(spec, (k, k + 1), state=state)
    ranks = range(len(tp_split))
    shards = [build_stage(spec, (k, k + 1), tp_split, ffn_split, r, state=state) for r in ranks]
    x, cos, sin, mask = _inputs(spec)
    x_full, x_tp = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_full = full.layers[str(k)](x_full, cos, sin, mask)  # (N, h)
    layers = [s.layers[str(k)] for s in shards]
    attn_parts = [layer.attn_branch(x_tp, cos, sin, mask) for layer in layers]  # partial (N, h) each
    h = x_tp + sum(attn_parts)  # (N, h): what reduce = all-reduce produces on every rank
    y_tp = h + sum(layer.mlp_branch(h) for layer in layers)  # (N, h)
    w = torch.randn(y_full.shape, generator=torch.Generator().manual_seed(1))
    (y_full * w).sum().backward()
    (y_tp * w).sum().backward()

    def layer_grads(module):
        return {n: p.grad.clone() for n, p in module.named_parameters() if n.startswith("layers.")}

    grads_full, grads_tp = layer_grads(full), [layer_grads(s) for s in shards]
    attn_full = full.layers[str(k)].attn_branch(x, cos, sin, mask)
    return (y_full, x_full.grad, grads_full, attn_full), (y_tp, x_tp.grad, grads_tp, sum(attn_parts))


@pytest.mark.parametrize("spec,tp_split,ffn_split", CASES, ids=IDS)
def test_shards_sum_to_full_layer(spec, tp_split, ffn_split, perturbed):
    """Shards' partial outputs sum to the unsharded layer's; input and weight gradients match."""
    state = perturbed(init_state(spec, seed=0))
    (y, dx, g, attn), (y_tp, dx_tp, g_tp, attn_tp) = _run_tp(spec, state, tp_split, ffn_split)
    torch.testing.assert_close(attn_tp, attn, atol=1e-5, rtol=0)
    torch.testing.assert_close(y_tp, y, atol=1e-5, rtol=0)
    torch.testing.assert_close(dx_tp, dx, atol=1e-5, rtol=0)
    gathered = gather_state(spec, g_tp, tp_split, ffn_split, mode="sum")
    assert gathered.keys() == g.keys()
    for name in g:
        torch.testing.assert_close(gathered[name], g[name], atol=1e-5, rtol=0, msg=name)


@pytest.mark.parametrize("spec,tp_split,ffn_split", CASES, ids=IDS)
def test_sync_tp_grads_completes_partial_gradients(spec, tp_split, ffn_split, perturbed):
    """After one summed buffer per rank, every shard's gradients are slices of the full gradients."""
    state = perturbed(init_state(spec, seed=0))
    (_, _, g, _), (_, _, g_tp, _) = _run_tp(spec, state, tp_split, ffn_split)
    total = sum(tp_grad_buffer(spec, gr, tp_split, ffn_split, r) for r, gr in enumerate(g_tp))
    for r, grads in enumerate(g_tp):
        sync_tp_grads(spec, grads, tp_split, ffn_split, r, all_reduce=lambda t: t.copy_(total))  # noqa: B023
        want = slice_state(spec, g, tp_split, ffn_split, r)
        for name in want:
            torch.testing.assert_close(grads[name], want[name], atol=1e-5, rtol=0, msg=name)


def test_injected_reduce_gives_full_output():
    """A shard's layer forward with `reduce` adding the other shards' partials equals the full layer."""
    spec, tp_split, ffn_split = CASES[3]
    state = init_state(spec, seed=0)
    full = build_stage(spec, (0, 1), state=state).layers["0"]
    shards = [build_stage(spec, (0, 1), tp_split, ffn_split, r, state=state).layers["0"] for r in range(3)]
    x, cos, sin, mask = _inputs(spec)
    with torch.no_grad():
        h = x + sum(s.attn_branch(x, cos, sin, mask) for s in shards)
        others = iter(
            [
                sum(s.attn_branch(x, cos, sin, mask) for s in shards[1:]),
                sum(s.mlp_branch(h) for s in shards[1:]),
            ]
        )
        got = shards[0](x, cos, sin, mask, reduce=lambda p: p + next(others))
        torch.testing.assert_close(got, full(x, cos, sin, mask), atol=1e-5, rtol=0)


def test_kv_ranges_cover_and_replicate():
    """Each shard holds exactly the kv heads its query heads read; straddled groups are replicated."""
    spec = model_preset("tiny-gqa")  # 6 heads, 2 kv heads: groups of 3
    assert [kv_range(spec, (2, 2, 2), r) for r in range(3)] == [(0, 1), (0, 2), (1, 2)]
    assert kv_is_replicated(spec, (2, 2, 2)) and not kv_is_replicated(spec, (3, 3))


@st.composite
def _splits(draw):
    tp = draw(st.integers(1, 8))
    cuts = sorted(draw(st.lists(st.integers(1, 7), min_size=tp - 1, max_size=tp - 1, unique=True)))
    heads = tuple(b - a for a, b in zip([0, *cuts], [*cuts, 8]))
    fcuts = sorted(draw(st.lists(st.integers(1, 95), min_size=tp - 1, max_size=tp - 1, unique=True)))
    ffn = tuple(b - a for a, b in zip([0, *fcuts], [*fcuts, 96]))
    return heads, ffn


@settings(max_examples=30, deadline=None)
@given(_splits())
def test_slice_gather_round_trip_is_exact(splits):
    """Slicing a full state for every rank and gathering it back (mode copy) is bit-exact."""
    tp_split, ffn_split = splits
    state = init_state(BIAS_GQA, seed=5)
    shards = [slice_state(BIAS_GQA, state, tp_split, ffn_split, r) for r in range(len(tp_split))]
    back = gather_state(BIAS_GQA, shards, tp_split, ffn_split, mode="copy")
    assert back.keys() == state.keys()
    assert all(torch.equal(back[n], state[n]) for n in state)
    # A shard's module accepts exactly these tensors.
    build_stage(BIAS_GQA, (0, 2), tp_split, ffn_split, len(tp_split) - 1, state=state)
