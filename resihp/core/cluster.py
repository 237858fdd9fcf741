"""Cluster state: nodes x devices, each with liveness and a speed factor, plus link bandwidth factors.

Immutable: applying a fault returns a new Cluster, so a scheduler can hold the state it planned for.
Device ids are global, `node = id // gpus_per_node`.

`gpu` is a hardware preset name (`resihp.cost.HARDWARE`) or a concrete `resihp.cost.Hardware`, e.g.
one calibrated from the runtime's own measurements (`resihp.runtime.adapt.calibrate`); the cost model
resolves either (`resihp.cost.hardware_preset`). core does not import cost, so an instance is
checked by its attributes here. Per-device speed factors stay in `speed` either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

# What the cost model reads from a Hardware (resihp.cost.hardware): a `gpu` object must have these.
HARDWARE_FIELDS = (
    "name", "peak_flops", "hbm_bytes", "hbm_bw", "intra_bw", "inter_bw", "alpha_intra_s", "alpha_inter_s",
    "efficiency",
)  # fmt: skip


@dataclass(frozen=True)
class Cluster:
    nodes: int
    gpus_per_node: int
    gpu: object = "a100-80g"  # a preset name (str) or a resihp.cost.Hardware
    speed: tuple[float, ...] = ()  # per device, in (0, 1]; empty = all healthy
    alive: tuple[bool, ...] = ()  # per device; empty = all alive
    links: tuple[tuple[int, int, float], ...] = field(default=())  # (a, b, factor) with a < b

    def __post_init__(self) -> None:
        if not isinstance(self.nodes, int) or self.nodes < 1:
            raise ValueError(f"cluster.nodes = {self.nodes!r}: must be a positive integer")
        if not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 1:
            raise ValueError(f"cluster.gpus_per_node = {self.gpus_per_node!r}: must be a positive integer")
        if isinstance(self.gpu, str):
            if not self.gpu:
                raise ValueError("cluster.gpu = '': must be a hardware preset name or a Hardware")
        else:
            missing = [k for k in HARDWARE_FIELDS if not hasattr(self.gpu, k)]
            if missing:
                raise ValueError(
                    f"cluster.gpu = {self.gpu!r}: must be a hardware preset name (str) or a "
                    f"resihp.cost.Hardware; missing {', '.join(missing)}"
                )
        n = self.nodes * self.gpus_per_node
        if not self.speed:
            object.__setattr__(self, "speed", (1.0,) * n)
        if not self.alive:
            object.__setattr__(self, "alive", (True,) * n)
        assert len(self.speed) == n and len(self.alive) == n
        for d, p in enumerate(self.speed):
            if not 0.0 < p <= 1.0:
                raise ValueError(f"speed of device {d} = {p!r}: must lie in (0, 1]")

    @property
    def gpu_name(self) -> str:
        """The preset name, or the Hardware's own name."""
        return self.gpu if isinstance(self.gpu, str) else self.gpu.name

    @property
    def num_devices(self) -> int:
        return self.nodes * self.gpus_per_node

    def node_of(self, device: int) -> int:
        return device // self.gpus_per_node

    def same_node(self, a: int, b: int) -> bool:
        return a // self.gpus_per_node == b // self.gpus_per_node

    def check_device(self, device: object, key: str = "device") -> int:
        if not isinstance(device, int) or isinstance(device, bool) or not (0 <= device < self.num_devices):
            raise ValueError(f"{key} = {device!r}: no such device; allowed: 0..{self.num_devices - 1}")
        return device

    def link_factor(self, a: int, b: int) -> float:
        """Bandwidth factor of the link between devices a and b (1 = healthy)."""
        lo, hi = min(a, b), max(a, b)
        factor = 1.0
        for x, y, f in self.links:
            if (x, y) == (lo, hi):
                factor = min(factor, f)
        return factor

    # --- state changes (each returns a new Cluster) ---
    def with_speed(self, device: int, p: float) -> Cluster:
        speed = list(self.speed)
        speed[device] = p
        return replace(self, speed=tuple(speed))

    def with_alive(self, device: int, alive: bool) -> Cluster:
        flags = list(self.alive)
        flags[device] = alive
        speed = list(self.speed)
        if alive:
            speed[device] = 1.0  # a re-joined device comes back healthy
        return replace(self, alive=tuple(flags), speed=tuple(speed))

    def with_link(self, a: int, b: int, factor: float) -> Cluster:
        lo, hi = min(a, b), max(a, b)
        kept = tuple(x for x in self.links if (x[0], x[1]) != (lo, hi))
        if factor < 1.0:
            kept = tuple(sorted(kept + ((lo, hi, factor),)))
        return replace(self, links=kept)

    def capacity(self) -> float:
        """Sum over live devices of their speed factor: the numerator of the capacity bound."""
        return sum(p for p, ok in zip(self.speed, self.alive) if ok)
