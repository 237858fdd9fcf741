"""PP-level adaptation: the paper's speed-proportional repartition and our exact min-max split."""

from __future__ import annotations

import itertools
import random

import pytest

from resihp.sched.partition import minmax_partition, repartition_paper, stage_times


def test_paper_example_fig5():
    """12 layers on 3 stages with stage 1 at speed 0.4: (4, 4, 4) -> (5, 2, 5), bottleneck 2x faster."""
    speeds = [1.0, 0.4, 1.0]
    assert repartition_paper(12, speeds) == (5, 2, 5)
    assert minmax_partition(12, speeds) == (5, 2, 5)
    before = max(stage_times((4, 4, 4), speeds))
    after = max(stage_times((5, 2, 5), speeds))
    assert before / after == pytest.approx(2.0)


def test_healthy_split_is_even():
    """Equal speeds give the even split, earlier stages taking the remainder."""
    assert repartition_paper(30, [1.0] * 4) == (8, 8, 7, 7)
    assert max(stage_times(minmax_partition(30, [1.0] * 4), [1.0] * 4)) == 8


def _brute(num_layers, speeds, caps, last):
    p = len(speeds)
    best = None
    for cuts in itertools.combinations(range(1, num_layers), p - 1):
        b = (0, *cuts, num_layers)
        counts = [b[k + 1] - b[k] for k in range(p)]
        if any(n > c for n, c in zip(counts, caps)):
            continue
        t = max(stage_times(counts, speeds, last_cost=last))
        best = t if best is None else min(best, t)
    return best


def test_minmax_matches_exhaustive_search():
    """On random small instances the min-max split equals the exhaustive optimum."""
    rng = random.Random(3)
    for _ in range(150):
        p = rng.randint(2, 5)
        L = rng.randint(p, 14)
        speeds = [rng.choice([0.3, 0.5, 0.75, 1.0, 2.0]) for _ in range(p)]
        caps = [rng.randint(1, L) for _ in range(p)]
        last = rng.choice([0.0, 0.6, 2.3])
        want = _brute(L, speeds, caps, last)
        if want is None:
            with pytest.raises(ValueError):
                minmax_partition(L, speeds, caps, last_cost=last)
            continue
        got = minmax_partition(L, speeds, caps, last_cost=last)
        assert sum(got) == L and all(1 <= n <= c for n, c in zip(got, caps))
        assert max(stage_times(got, speeds, last_cost=last)) == pytest.approx(want)


def test_paper_repartition_respects_memory_caps():
    """The paper's split moves layers off stages whose memory cannot hold them."""
    counts = repartition_paper(12, [1.0, 0.4, 1.0], caps=[4, 12, 12])
    assert counts[0] <= 4 and sum(counts) == 12


def test_no_split_fits_raises():
    """Capacities below the layer count raise one clear ValueError."""
    with pytest.raises(ValueError, match="fits memory"):
        minmax_partition(12, [1.0, 1.0], caps=[5, 5])
    with pytest.raises(ValueError, match="fits memory"):
        repartition_paper(12, [1.0, 1.0], caps=[5, 5])
