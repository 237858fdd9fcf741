"""Hardware presets: peak compute, HBM, link bandwidths and latencies (cost-model.md §4.2, §5).

Units are SI: FLOP/s, bytes (1 GB = 1e9 bytes, the vendors' nominal capacity), bytes/s, seconds.
Link bandwidths are *effective* per-direction rates, 0.8 x the datasheet rate (cost-model.md §4.2
suggested default until calibrated with nccl-tests busbw). `efficiency` is the achieved fraction of
peak for matmul-dominated work (0.45 on A100, 0.40 on Hopper, cost-model.md §1.4); it is an input
calibrated against published MFU, not a prediction.

`p2p_bw` / `alpha_p2p_s` (None: the link's `intra_bw` / `inter_bw` and latency, as collectives): the
point-to-point (pipeline) transfers' own rate and latency, for fabrics where they differ from the
collectives' — the CPU runtime's link model throttles P2P blocks only (`resihp.runtime.adapt.calibrate`).
`layer_overhead_s`: a fixed cost per layer in every F and B chunk (kernel launches, framework
dispatch), not shared by TP; 0 on the GPU presets, where the matmuls dominate, but what dominates
the CPU runtime's tiny models.
A `Cluster` carries a preset name or a Hardware instance (`Cluster.gpu`); `hardware_preset`
resolves both.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

LINK_EFFICIENCY = 0.8  # achieved / datasheet per-direction link rate (cost-model.md §4.2)


@dataclass(frozen=True)
class Hardware:
    """One accelerator type and the fabric around it."""

    name: str
    peak_flops: float  # dense bf16 FLOP/s
    hbm_bytes: float  # device memory capacity
    hbm_bw: float  # device memory bandwidth, bytes/s (memory-bound work: norms, optimizer step)
    intra_bw: float  # effective per-direction bandwidth between two GPUs of one node (NVLink)
    inter_bw: float  # effective per-GPU scale-out bandwidth (the GPU's own NIC, rail-optimised)
    alpha_intra_s: float  # latency per collective step inside a node
    alpha_inter_s: float  # latency per collective step across nodes
    efficiency: float  # achieved / peak FLOP/s for the matmuls (calibrated)
    p2p_bw: float | None = None  # effective P2P (pipeline) bandwidth, bytes/s; None: intra_bw / inter_bw
    alpha_p2p_s: float | None = None  # latency per P2P transfer; None: alpha_intra_s / alpha_inter_s
    layer_overhead_s: float = 0.0  # fixed seconds per layer in each F and B chunk (launch / dispatch)

    def __post_init__(self) -> None:
        for key in ("peak_flops", "hbm_bytes", "hbm_bw", "intra_bw", "inter_bw"):
            if not getattr(self, key) > 0:
                raise ValueError(f"hardware.{key} = {getattr(self, key)!r}: must be > 0")
        for key in ("alpha_intra_s", "alpha_inter_s"):
            if not getattr(self, key) >= 0:
                raise ValueError(f"hardware.{key} = {getattr(self, key)!r}: must be >= 0")
        if not 0.0 < self.efficiency <= 1.0:
            raise ValueError(f"hardware.efficiency = {self.efficiency!r}: must lie in (0, 1]")
        if self.p2p_bw is not None and not self.p2p_bw > 0:
            raise ValueError(f"hardware.p2p_bw = {self.p2p_bw!r}: must be > 0 (or None: the link's)")
        if self.alpha_p2p_s is not None and not self.alpha_p2p_s >= 0:
            raise ValueError(f"hardware.alpha_p2p_s = {self.alpha_p2p_s!r}: must be >= 0 (or None)")
        if not self.layer_overhead_s >= 0:
            raise ValueError(f"hardware.layer_overhead_s = {self.layer_overhead_s!r}: must be >= 0")

    @property
    def achieved_flops(self) -> float:
        """FLOP/s one healthy device sustains on the model's matmuls."""
        return self.efficiency * self.peak_flops

    def with_changes(self, **changes) -> Hardware:
        return replace(self, **changes)


def _gpu(name, tflops, hbm_gb, hbm_tbs, nvlink_dir_gbs, nic_gbs, efficiency) -> Hardware:
    return Hardware(
        name=name,
        peak_flops=tflops * 1e12,
        hbm_bytes=hbm_gb * 1e9,
        hbm_bw=hbm_tbs * 1e12,
        intra_bw=LINK_EFFICIENCY * nvlink_dir_gbs * 1e9,
        inter_bw=LINK_EFFICIENCY * nic_gbs * 1e9,
        alpha_intra_s=5e-6,
        alpha_inter_s=10e-6,
        efficiency=efficiency,
    )


HARDWARE: dict[str, Hardware] = {
    hw.name: hw
    for hw in (
        # name, dense bf16 TFLOP/s, HBM GB, HBM TB/s, NVLink GB/s per direction, NIC GB/s, efficiency
        _gpu("a100-40g", 312.0, 40, 1.555, 300, 25, 0.45),
        _gpu("a100-80g", 312.0, 80, 2.039, 300, 25, 0.45),
        _gpu("h100", 989.4, 80, 3.35, 450, 50, 0.40),
        _gpu("h800", 989.4, 80, 3.35, 200, 50, 0.40),
        _gpu("h200", 989.4, 141, 4.8, 450, 50, 0.40),
        # A rough placeholder for the tiny CPU runtime models (gloo over loopback): 50 GFLOP/s
        # achieved, 24 GB of RAM, a few GB/s between processes. Calibrate it from the runtime's
        # measured chunk times (resihp.cost.calibration) before trusting any prediction.
        Hardware(
            name="cpu",
            peak_flops=50e9,
            hbm_bytes=24e9,
            hbm_bw=20e9,
            intra_bw=4e9,
            inter_bw=2e9,
            alpha_intra_s=50e-6,
            alpha_inter_s=100e-6,
            efficiency=1.0,
        ),
    )
}


def hardware_preset(name: str | Hardware) -> Hardware:
    """The preset called `name` (a Hardware is returned unchanged, so `hardware_preset(cluster.gpu)`
    takes either form of `Cluster.gpu`); ValueError listing the allowed names otherwise."""
    if isinstance(name, Hardware):
        return name
    try:
        return HARDWARE[name]
    except KeyError:
        raise ValueError(f"cluster.gpu = {name!r}: unknown; allowed: {', '.join(HARDWARE)}") from None
