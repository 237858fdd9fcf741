"""Alpha-beta collectives and PP transfers over intra- and inter-node links (cost-model.md §4)."""

import numpy as np
import pytest

from resihp.core import Cluster, Plan, Stage, build_stage, model_preset
from resihp.cost import build_costs, hardware_preset
from resihp.cost.comm import Links, allgather_s, pp_transfer_s, ring_allreduce_s

H100 = hardware_preset("h100")
L7 = model_preset("llama2-7b")


def test_ring_allreduce_closed_form():
    """Ring all-reduce costs 2(n-1)·α + 2(n-1)/n·S/B; one device costs nothing."""
    assert ring_allreduce_s(1e9, 8, 1e11, 1e-5) == pytest.approx(14e-5 + 2 * 7 / 8 * 1e-2)
    assert ring_allreduce_s(1e9, 1, 1e11, 1e-5) == 0.0
    assert allgather_s(1e9, 4, 1e11, 1e-5) == pytest.approx(3e-5 + 0.75e-2)


def test_link_factor_half_doubles_the_p2p_bandwidth_term():
    """A link at bandwidth factor 0.5 doubles the bandwidth term of a P2P crossing it, latency unchanged."""
    cluster = Cluster(2, 8, "h100")
    plan = Plan(L7, ((build_stage(L7, (0,), (0, 16)), build_stage(L7, (8,), (16, 32))),), (2,))
    tokens, sq = np.full(2, 4096.0), np.full(2, 4096.0**2)
    healthy = build_costs(L7, plan, cluster, tokens, sq).p2p((0, 0), (0, 1))
    slow = build_costs(L7, plan, cluster.with_link(0, 8, 0.5), tokens, sq).p2p((0, 0), (0, 1))
    alpha = H100.alpha_inter_s
    assert healthy - alpha == pytest.approx(4096 * L7.hidden * 2 / H100.inter_bw)
    assert slow - alpha == pytest.approx(2 * (healthy - alpha))


def test_heterogeneous_tp_p2p_per_rank_load():
    """TP 2 -> TP 4 across nodes moves T·h·2/min(2, 4) per rank, then all-gathers on the receiver."""
    links = Links(Cluster(2, 8, "h100"), H100)
    nbytes = 4096 * L7.hidden * 2.0
    send, recv = (0, 1), (8, 9, 10, 11)
    wire = pp_transfer_s(nbytes, send, recv, links, gather=False)
    assert wire == pytest.approx(H100.alpha_inter_s + nbytes / 2 / H100.inter_bw)
    assert pp_transfer_s(nbytes, recv, send, links, gather=False) == pytest.approx(wire)
    full = pp_transfer_s(nbytes, send, recv, links)
    assert full - wire == pytest.approx(allgather_s(nbytes, 4, H100.intra_bw, H100.alpha_intra_s))
    # Equal sizes: scatter/gather over t NICs, no all-gather.
    assert pp_transfer_s(nbytes, recv, (12, 13, 14, 15), links) == pytest.approx(
        H100.alpha_intra_s + nbytes / 4 / H100.intra_bw
    )


def test_heterogeneous_tp_p2p_through_build_costs():
    """build_costs' p2p between a TP-2 and a TP-4 stage uses the ResiHP split rule."""
    cluster = Cluster(2, 8, "h100")
    s0 = build_stage(L7, (0, 1), (0, 16))
    s1 = build_stage(L7, (8, 9, 10, 11), (16, 32))
    plan = Plan(L7, ((s0, s1),), (2,))
    costs = build_costs(L7, plan, cluster, np.full(2, 4096.0), np.full(2, 4096.0**2))
    nbytes = 4096 * L7.hidden * 2.0
    assert costs.p2p((0, 0), (0, 1)) == pytest.approx(
        pp_transfer_s(nbytes, (0, 1), (8, 9, 10, 11), Links(cluster, H100))
    )
    assert isinstance(s0, Stage)


def test_tp_group_spanning_nodes_uses_the_nic():
    """A TP ring that leaves its node runs at the NIC's bandwidth, not NVLink's."""
    cluster = Cluster(2, 8, "h100")
    inside = Links(cluster, H100).ring((0, 1, 2, 3))
    across = Links(cluster, H100).ring((6, 7, 8, 9))
    assert inside == (H100.intra_bw, H100.alpha_intra_s)
    assert across == (H100.inter_bw, H100.alpha_inter_s)


def test_p2p_bandwidth_prices_pipeline_transfers_only():
    """`Hardware.p2p_bw` / `alpha_p2p_s` (the CPU runtime's link model) set PP transfer times, times
    a slow link's factor; TP and DP collectives keep the link bandwidth."""
    hw = hardware_preset("cpu").with_changes(p2p_bw=1e6, alpha_p2p_s=1e-3)
    cluster = Cluster(1, 4, hw)
    links = Links(cluster, hw)
    assert pp_transfer_s(2e6, (0,), (1,), links) == pytest.approx(1e-3 + 2.0)
    assert links.ring((0, 1)) == (hw.intra_bw, hw.alpha_intra_s)
    slow = Links(cluster.with_link(0, 1, 0.25), hw)
    assert pp_transfer_s(2e6, (0,), (1,), slow) == pytest.approx(1e-3 + 8.0)
    assert pp_transfer_s(2e6, (2,), (3,), slow) == pytest.approx(1e-3 + 2.0)
