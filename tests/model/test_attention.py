"""Document-aware attention (`layers.attention`): one causal attention per packed document equals the
dense masked oracle (forward and gradients, fp32), and its cost follows the documents."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from resihp.core.model_spec import model_preset
from resihp.model import Docs, attention, build_stage, segment_mask
from resihp.model.attention import attention_path


def _qkv(n: int, heads: int = 4, hd: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(heads, n, hd, generator=g, requires_grad=True) for _ in range(3)]


def _segments(lens) -> torch.Tensor:
    return torch.cat([torch.full((n,), i, dtype=torch.long) for i, n in enumerate(lens)])


@settings(max_examples=40, deadline=None)
@given(lens=st.lists(st.integers(1, 40), min_size=1, max_size=8), seed=st.integers(0, 1000))
def test_per_document_attention_equals_the_dense_mask(lens, seed):
    """Forward and the gradients of q, k, v agree with the masked N x N attention within 1e-5."""
    q, k, v = _qkv(sum(lens), seed=seed)
    up = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 1))
    got = attention(q, k, v, Docs(tuple(lens)))
    want = attention(q, k, v, segment_mask(_segments(lens)))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    g_got = torch.autograd.grad(got, (q, k, v), up)
    g_want = torch.autograd.grad(want, (q, k, v), up)
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_paths_and_docs_from_segment_ids():
    """A mask is the dense oracle, one document the causal kernel, several the per-document path on
    CPU; `Docs.of` reads the lengths off contiguous segment ids."""
    q = torch.zeros(2, 6, 8)
    seg = torch.tensor([0, 0, 1, 1, 1, 2])
    assert Docs.of(seg).lens == (2, 3, 1) and Docs.of(seg).spans() == [(0, 2), (2, 5), (5, 6)]
    assert attention_path(q, segment_mask(seg)) == "dense"
    assert attention_path(q, Docs((6,))) == "causal"
    assert attention_path(q, Docs((2, 3, 1))) == "per-doc"
    assert Docs((2, 3, 1)).cu(torch.device("cpu")).tolist() == [0, 2, 5, 6]
    # buckets by the next power of two: (1), (2), (3 padded to 4, 4), (5 alone: not padded)
    assert Docs((2, 3, 1, 4, 5)).buckets() == [
        (1, [(5, 6)]),
        (2, [(0, 2)]),
        (4, [(2, 5), (6, 10)]),
        (8, [(10, 15)]),
    ]


def test_stage_with_documents_equals_the_dense_oracle(perturbed):
    """A whole GQA model (every layer through the document path) equals the dense-mask model, logits
    and parameter gradients, within 1e-5."""
    spec = model_preset("tiny-gqa")
    from resihp.model import init_state

    model = build_stage(spec, state=perturbed(init_state(spec, 3)))
    lens = (17, 1, 30, 16)
    seg = _segments(lens)
    pos = torch.cat([torch.arange(n) for n in lens])
    ids = torch.randint(0, spec.vocab, (sum(lens),), generator=torch.Generator().manual_seed(4))
    outs = []
    for docs in (Docs(lens), segment_mask(seg)):
        logits = model(ids, seg, pos, docs=docs)
        grads = torch.autograd.grad(logits.square().mean(), list(model.parameters()))
        outs.append((logits, grads))
    torch.testing.assert_close(outs[0][0], outs[1][0], atol=1e-5, rtol=0)
    for a, b in zip(outs[0][1], outs[1][1]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_varlen_attention_on_cuda_equals_the_dense_mask():
    """On CUDA in bf16 the fused varlen kernel (when torch has it) matches the dense path at bf16
    tolerance; in fp32 the per-document path matches it within 1e-5."""
    lens = (100, 3, 250, 159)
    for dtype, tol in ((torch.bfloat16, 2e-2), (torch.float32, 1e-5)):
        q, k, v = (t.detach().to("cuda", dtype).requires_grad_() for t in _qkv(sum(lens), hd=64))
        got = attention(q, k, v, Docs(lens))
        want = attention(q, k, v, segment_mask(_segments(lens).cuda()))
        torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=0)
