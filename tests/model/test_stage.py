import torch

from resihp.core.model_spec import model_preset
from resihp.model import build_stage, segment_mask


def test_segment_mask_is_causal_within_segments():
    """The mask allows exactly the pairs j <= i inside the same segment."""
    seg = torch.tensor([0, 0, 1, 1, 1, 2])
    mask = segment_mask(seg)
    for i in range(6):
        for j in range(6):
            assert bool(mask[i, j]) == (j <= i and seg[i] == seg[j])


def test_packed_logits_equal_separate_documents():
    """Logits of two documents packed in one micro-batch equal each document's logits run alone."""
    spec = model_preset("tiny-gqa")
    model = build_stage(spec, seed=0)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randint(0, 256, (37,), generator=g), torch.randint(0, 256, (27,), generator=g)
    packed = torch.cat([a, b])  # (64,)
    seg = torch.cat([torch.zeros(37, dtype=torch.long), torch.ones(27, dtype=torch.long)])
    pos = torch.cat([torch.arange(37), torch.arange(27)])
    with torch.no_grad():
        got = model(packed, seg, pos)  # (64, V)
        alone_a = model(a, torch.zeros(37, dtype=torch.long), torch.arange(37))
        alone_b = model(b, torch.zeros(27, dtype=torch.long), torch.arange(27))
    torch.testing.assert_close(got, torch.cat([alone_a, alone_b]), atol=1e-5, rtol=0)


def test_stages_chain_to_the_full_model():
    """Stages [0, 2), [2, 3), [3, 6) each built from the seed chain to the full model's logits."""
    spec = model_preset("tiny-gqa")
    full = build_stage(spec, seed=9)
    stages = [build_stage(spec, layers, seed=9) for layers in ((0, 2), (2, 3), (3, 6))]
    assert [(s.is_first, s.is_last) for s in stages] == [(True, False), (False, False), (False, True)]
    assert "embed.weight" not in stages[1].state_dict() and "lm_head.weight" in stages[2].state_dict()
    ids = torch.randint(0, 256, (30,), generator=torch.Generator().manual_seed(2))
    seg, pos = torch.zeros(30, dtype=torch.long), torch.arange(30)
    with torch.no_grad():
        x = ids
        for stage in stages:
            x = stage(x, seg, pos)  # (N, h), then (N, V) after the last stage
        torch.testing.assert_close(x, full(ids, seg, pos), atol=0, rtol=0)
