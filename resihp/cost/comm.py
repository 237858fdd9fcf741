"""Alpha-beta communication times (cost-model.md §4.2) over a cluster's links.

    ring all-reduce   2(n-1)·α + 2(n-1)/n · S/B
    all-gather / reduce-scatter   (n-1)·α + (n-1)/n · S/B      (S = the full, gathered size)
    point-to-point    α + S/B

B is the bandwidth of the slowest link a ring uses: intra-node (NVLink) when both devices share a
node, else the GPU's own NIC, divided by nothing and multiplied by the cluster's bandwidth factor
`Cluster.link_factor(a, b)` for that device pair (a link fail-slow at factor 0.5 halves it).
Point-to-point transfers use `Hardware.p2p_bw` / `alpha_p2p_s` instead when set (times the same
factor).
"""

from __future__ import annotations

import numpy as np

from resihp.core.cluster import Cluster

from .hardware import Hardware


def ring_allreduce_s(nbytes: float, n: int, bw: float, alpha_s: float) -> float:
    if n <= 1:
        return 0.0
    return 2 * (n - 1) * alpha_s + 2.0 * (n - 1) / n * nbytes / bw


def allgather_s(nbytes: float, n: int, bw: float, alpha_s: float) -> float:
    """All-gather (or reduce-scatter) whose gathered result is `nbytes`."""
    if n <= 1:
        return 0.0
    return (n - 1) * alpha_s + (n - 1) / n * nbytes / bw


class Links:
    """Bandwidth and latency between device pairs of one cluster on one hardware type."""

    def __init__(self, cluster: Cluster, hardware: Hardware):
        self.gpn = cluster.gpus_per_node
        self.hw = hardware
        self.factors = {(a, b): f for a, b, f in cluster.links}
        if self.factors:  # Cluster.link_factor semantics: the smallest factor listed for a pair
            for a, b, f in cluster.links:
                self.factors[(a, b)] = min(self.factors[(a, b)], f)
        self.devices = {x for pair in self.factors for x in pair}  # devices on a degraded link

    def bw(self, a: int, b: int) -> float:
        same = a // self.gpn == b // self.gpn
        base = self.hw.intra_bw if same else self.hw.inter_bw
        if self.factors:
            base *= self.factors.get((min(a, b), max(a, b)), 1.0)
        return base

    def alpha(self, a: int, b: int) -> float:
        return self.hw.alpha_intra_s if a // self.gpn == b // self.gpn else self.hw.alpha_inter_s

    def p2p_bw(self, a: int, b: int) -> float:
        """`bw` for a point-to-point transfer: `Hardware.p2p_bw` (times the pair's factor) when set."""
        if self.hw.p2p_bw is None:
            return self.bw(a, b)
        return self.hw.p2p_bw * self.factors.get((min(a, b), max(a, b)), 1.0)

    def p2p_alpha(self, a: int, b: int) -> float:
        return self.alpha(a, b) if self.hw.alpha_p2p_s is None else self.hw.alpha_p2p_s

    def bw_pairs(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Vectorised `bw` over arrays of device ids."""
        same = a // self.gpn == b // self.gpn
        out = np.where(same, self.hw.intra_bw, self.hw.inter_bw)
        if self.factors:
            lo, hi = np.minimum(a, b), np.maximum(a, b)
            for (x, y), f in self.factors.items():
                out = np.where((lo == x) & (hi == y), out * f, out)
        return out

    def slowest(self, a: list[int], b: list[int]) -> tuple[float, float]:
        """(bandwidth of the slowest of the links a[k] -> b[k], latency: intra-node only when
        every pair shares a node). Few pairs go through `bw` one by one (numpy's per-call cost
        exceeds the work), many through `bw_pairs`: the same value either way."""
        gpn = self.gpn
        if len(a) <= 64:
            inside = [x // gpn == y // gpn for x, y in zip(a, b)]
            same = all(inside)
            if self.factors:
                bw = float(min(self.bw(x, y) for x, y in zip(a, b)))
            else:  # every link is an intra- or an inter-node one: the smallest of those present
                present = ([self.hw.intra_bw] if any(inside) else []) + ([] if same else [self.hw.inter_bw])
                bw = float(min(present))
        else:
            x, y = np.asarray(a), np.asarray(b)
            same = bool(np.all(x // gpn == y // gpn))
            bw = float(self.bw_pairs(x, y).min())
        return bw, self.hw.alpha_intra_s if same else self.hw.alpha_inter_s

    def ring(self, devices: tuple[int, ...]) -> tuple[float, float]:
        """(bottleneck bandwidth, per-step latency) of a ring over `devices` in the given order."""
        if len(devices) <= 1:
            return float("inf"), 0.0
        return self.slowest(list(devices), list(devices[1:] + devices[:1]))


def tp_comm_coeffs(
    hidden: int, num_layers: int, devices: tuple[int, ...], links: Links
) -> tuple[float, float]:
    """(c0 [s], per-token [s]) of the TP collectives of one F or one B chunk.

    Megatron TP: two all-reduces of T·h bf16 values per layer in F and two in B (with sequence
    parallelism an all-gather plus a reduce-scatter, the same bytes), none in W; fully exposed.
    """
    t = len(devices)
    if t <= 1:
        return 0.0, 0.0
    bw, alpha = links.ring(devices)
    n_ops = 2 * num_layers
    return n_ops * 2 * (t - 1) * alpha, n_ops * 2.0 * (t - 1) / t * hidden * 2 / bw


def pp_transfer_s(
    nbytes: float, send: tuple[int, ...], recv: tuple[int, ...], links: Links, gather: bool = True
) -> float:
    """One activation (or gradient) transfer of `nbytes` from TP group `send` to TP group `recv`.

    ResiHP §7: the tensor is cut into N = max(t_send, t_recv) equal chunks; chunk c goes from sender
    c·t_send//N to receiver c·t_recv//N, so each crosses once and a rank moves at most
    nbytes/min(t_send, t_recv). Each rank's NIC serialises its own chunks; the transfer lasts as long
    as the busiest rank (summing chunk/bandwidth over the links it uses, so the slowest link counts).
    Equal group sizes need nothing more (sequence-parallel shards line up); different sizes end with
    an all-gather over the receiving group (`gather`).
    """
    ts, tr = len(send), len(recv)
    n = max(ts, tr)
    piece = nbytes / n
    load: dict[tuple[str, int], float] = {}
    alpha = 0.0
    for c in range(n):
        s, r = send[c * ts // n], recv[c * tr // n]
        dt = piece / links.p2p_bw(s, r)
        load[("s", s)] = load.get(("s", s), 0.0) + dt
        load[("r", r)] = load.get(("r", r), 0.0) + dt
        alpha = max(alpha, links.p2p_alpha(s, r))
    total = alpha + max(load.values())
    if gather and ts != tr and tr > 1:
        bw, a = links.ring(recv)
        total += allgather_s(nbytes, tr, bw, a)
    return total


def dp_ring(groups: list[tuple[int, ...]], links: Links) -> tuple[float, float]:
    """(bottleneck bandwidth, latency) of the gradient rings over DP groups holding the same layers.

    TP rank k of each group joins ring k (rank k mod the group's size where sizes differ); all
    rings run at once, so the slowest link of any of them sets the pace.
    """
    if len(groups) <= 1:
        return float("inf"), 0.0
    a_list, b_list = [], []
    for g, h in zip(groups, groups[1:] + groups[:1]):
        n = max(len(g), len(h))
        a_list += [g[k % len(g)] for k in range(n)]
        b_list += [h[k % len(h)] for k in range(n)]
    return links.slowest(a_list, b_list)
