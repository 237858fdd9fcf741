"""The Plan: one explicit, possibly irregular layout of a job over devices (architecture §2).

A replica is an ordered tuple of stages. A stage is a TP group (device ids, any size; empty means
a *hollow* stage whose work all runs elsewhere), a contiguous layer range, and the split of query
heads and FFN columns over the group (may be uneven). `assignment` lists the (source replica,
micro-batch, stage) chunks that execute on another replica's same-layer stage (workload migration);
everything else runs at home. Every chunk runs exactly once. Plans are immutable and validated on
construction; a bad plan raises ValueError naming what is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .model_spec import ModelSpec
from .schedule import SCHEDULES as _REGISTRY

SCHEDULES = tuple(_REGISTRY)  # names of core.schedule's registry


def even_split(total: int, parts: int) -> tuple[int, ...]:
    """`total` split into `parts` integers differing by at most one, larger ones first."""
    base, extra = divmod(total, parts)
    return tuple(base + (1 if k < extra else 0) for k in range(parts))


def split_by_weight(
    total: int, weights: list[float] | tuple[float, ...], minimum: int = 1
) -> tuple[int, ...]:
    """`total` split in proportion to `weights` (largest remainder), each share >= `minimum`."""
    n = len(weights)
    if n * minimum > total:
        raise ValueError(f"cannot split {total} into {n} shares of at least {minimum}")
    wsum = float(sum(weights))
    spare = total - n * minimum
    raw = [spare * w / wsum for w in weights]
    shares = [int(r) for r in raw]
    order = sorted(range(n), key=lambda k: (-(raw[k] - shares[k]), k))
    for k in order[: spare - sum(shares)]:
        shares[k] += 1
    return tuple(s + minimum for s in shares)


@dataclass(frozen=True)
class Stage:
    devices: tuple[int, ...]
    layers: tuple[int, int]  # [start, end)
    tp_split: tuple[int, ...] = ()  # query heads per device
    ffn_split: tuple[int, ...] = ()  # FFN columns per device

    @property
    def tp(self) -> int:
        return len(self.devices)

    @property
    def num_layers(self) -> int:
        return self.layers[1] - self.layers[0]

    @property
    def hollow(self) -> bool:
        return not self.devices

    def to_dict(self) -> dict:
        return {
            "devices": list(self.devices),
            "layers": list(self.layers),
            "tp_split": list(self.tp_split),
            "ffn_split": list(self.ffn_split),
        }


def build_stage(model: ModelSpec, devices, layers, speeds=None) -> Stage:
    """A stage whose heads and FFN columns are split over `devices` in proportion to `speeds`."""
    devices = tuple(devices)
    if not devices:
        return Stage((), tuple(layers))
    weights = list(speeds) if speeds is not None else [1.0] * len(devices)
    return Stage(
        devices,
        tuple(layers),
        split_by_weight(model.heads, weights),
        split_by_weight(model.ffn, weights),
    )


@dataclass(frozen=True)
class Plan:
    model: ModelSpec
    replicas: tuple[tuple[Stage, ...], ...]
    microbatches: tuple[int, ...]  # per replica per iteration
    schedule: str = "1f1b"
    assignment: tuple[tuple[int, int, int, int], ...] = ()  # (src replica, mb, stage, exec replica)
    standby: tuple[int, ...] = ()
    generation: int = 0
    _exec: dict = field(default=None, init=False, repr=False, compare=False)
    # results of pure functions of the plan (e.g. `core.segments.grad_segments`), computed once
    _derived: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "replicas", tuple(tuple(r) for r in self.replicas))
        object.__setattr__(self, "microbatches", tuple(self.microbatches))
        object.__setattr__(self, "assignment", tuple(sorted(tuple(a) for a in self.assignment)))
        object.__setattr__(self, "standby", tuple(sorted(self.standby)))
        self._validate()
        object.__setattr__(self, "_exec", {a[:3]: a[3] for a in self.assignment})

    # ------------------------------------------------------------------ validation
    def _validate(self) -> None:
        m = self.model
        if self.schedule not in SCHEDULES:
            raise ValueError(f"parallel.schedule = {self.schedule!r}: allowed: {', '.join(SCHEDULES)}")
        if not self.replicas:
            raise ValueError("plan has no replicas; dp must be >= 1")
        if len(self.microbatches) != len(self.replicas):
            raise ValueError(
                f"plan.microbatches has {len(self.microbatches)} entries for {len(self.replicas)} replicas"
            )
        if any(not isinstance(x, int) or x < 0 for x in self.microbatches) or sum(self.microbatches) < 1:
            raise ValueError(f"plan.microbatches = {list(self.microbatches)}: need integers >= 0, sum >= 1")
        seen: dict[int, str] = {}
        for d, stages in enumerate(self.replicas):
            if not stages:
                raise ValueError(f"replica {d} has no stages")
            if len(stages) > m.num_layers:
                raise ValueError(
                    f"pp = {len(stages)} stages in replica {d}: more than the model's {m.num_layers} layers"
                )
            cursor = 0
            for i, st in enumerate(stages):
                where = f"replica {d} stage {i}"
                lo, hi = st.layers
                if lo != cursor or hi <= lo:
                    raise ValueError(
                        f"{where}: layers {list(st.layers)} must start at {cursor} and hold >= 1 layer"
                    )
                cursor = hi
                if st.hollow:
                    if st.tp_split or st.ffn_split:
                        raise ValueError(f"{where}: a hollow stage has no TP split")
                    continue
                if len(st.tp_split) != st.tp or len(st.ffn_split) != st.tp:
                    raise ValueError(f"{where}: tp_split and ffn_split need one entry per device")
                if st.tp > m.heads:
                    raise ValueError(f"{where}: tp = {st.tp} exceeds the model's {m.heads} heads")
                if min(st.tp_split) < 1 or sum(st.tp_split) != m.heads:
                    raise ValueError(
                        f"{where}: tp_split {list(st.tp_split)} must be >= 1 each and sum to {m.heads} heads"
                    )
                if min(st.ffn_split) < 1 or sum(st.ffn_split) != m.ffn:
                    raise ValueError(f"{where}: ffn_split must be >= 1 each and sum to {m.ffn} columns")
                for dev in st.devices:
                    if dev in seen:
                        raise ValueError(f"device {dev} is used twice: {seen[dev]} and {where}")
                    seen[dev] = where
            if cursor != m.num_layers:
                raise ValueError(f"replica {d}: stages cover layers [0, {cursor}), model has {m.num_layers}")
        for dev in self.standby:
            if dev in seen:
                raise ValueError(f"standby device {dev} is also in {seen[dev]}")
        keys = set()
        for src, j, i, dst in self.assignment:
            where = f"assignment ({src}, {j}, {i}) -> {dst}"
            if not (0 <= src < len(self.replicas) and 0 <= dst < len(self.replicas)) or src == dst:
                raise ValueError(f"{where}: replicas must exist and differ")
            if not 0 <= j < self.microbatches[src] or not 0 <= i < len(self.replicas[src]):
                raise ValueError(f"{where}: no such micro-batch or stage in replica {src}")
            if i >= len(self.replicas[dst]) or self.replicas[dst][i].layers != self.replicas[src][i].layers:
                raise ValueError(f"{where}: replica {dst} has no stage {i} with the same layers")
            if self.replicas[dst][i].hollow:
                raise ValueError(f"{where}: replica {dst} stage {i} is hollow")
            if (src, j, i) in keys:
                raise ValueError(f"{where}: chunk assigned twice")
            keys.add((src, j, i))
        for d, stages in enumerate(self.replicas):
            for i, st in enumerate(stages):
                if st.hollow:
                    for j in range(self.microbatches[d]):
                        if (d, j, i) not in keys:
                            raise ValueError(
                                f"replica {d} stage {i} is hollow but micro-batch {j} is not reassigned"
                            )

    # ------------------------------------------------------------------ queries
    @property
    def dp(self) -> int:
        return len(self.replicas)

    @property
    def global_microbatches(self) -> int:
        return sum(self.microbatches)

    def mb_offset(self, replica: int) -> int:
        """Index of replica's first micro-batch in the iteration's global batch."""
        return sum(self.microbatches[:replica])

    def executor(self, src: int, j: int, i: int) -> int:
        """The replica that executes stage i of micro-batch j of replica src."""
        return self._exec.get((src, j, i), src)

    def devices(self) -> list[int]:
        return sorted(dev for stages in self.replicas for st in stages for dev in st.devices)

    def stage_of(self, device: int) -> tuple[int, int] | None:
        for d, stages in enumerate(self.replicas):
            for i, st in enumerate(stages):
                if device in st.devices:
                    return d, i
        return None

    def check_cluster(self, cluster) -> None:
        """ValueError if the plan names a device the cluster lacks or a dead one."""
        for dev in self.devices() + list(self.standby):
            cluster.check_device(dev, "plan device")
            if not cluster.alive[dev]:
                raise ValueError(f"plan uses device {dev}, which is dead")

    def with_changes(self, **changes) -> Plan:
        return replace(self, **changes)

    def to_dict(self) -> dict:
        return {
            "schedule": self.schedule,
            "generation": self.generation,
            "replicas": [[st.to_dict() for st in stages] for stages in self.replicas],
            "microbatches": list(self.microbatches),
            "assignment": [list(a) for a in self.assignment],
            "standby": list(self.standby),
        }

    # ------------------------------------------------------------------ builders
    @classmethod
    def uniform(
        cls,
        model: ModelSpec,
        tp: int,
        pp: int,
        dp: int,
        microbatches: int,
        schedule: str = "1f1b",
        devices: list[int] | None = None,
        layer_split: tuple[int, ...] | None = None,
    ) -> Plan:
        """Megatron-style layout: device = tp_rank + tp*(pp_rank + pp*dp_rank) over `devices`.

        TP groups are contiguous (inside a node when tp divides gpus_per_node) and each replica is
        a contiguous block of tp*pp devices. Layers are split as evenly as possible, earlier
        stages taking the remainder (60 layers on 8 stages: 8,8,8,8,7,7,7,7).
        """
        for key, v in (("tp", tp), ("pp", pp), ("dp", dp)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"parallel.{key} = {v!r}: must be a positive integer")
        if pp > model.num_layers:
            raise ValueError(f"parallel.pp = {pp}: more stages than the model's {model.num_layers} layers")
        if tp > model.heads:
            raise ValueError(f"parallel.tp = {tp}: more than the model's {model.heads} heads")
        devices = list(range(tp * pp * dp)) if devices is None else list(devices)
        if len(devices) != tp * pp * dp:
            raise ValueError(f"tp*pp*dp = {tp * pp * dp} but {len(devices)} devices were given")
        split = layer_split or even_split(model.num_layers, pp)
        if len(split) != pp or sum(split) != model.num_layers or min(split) < 1:
            raise ValueError(
                f"layer split {list(split)} does not give {pp} stages over {model.num_layers} layers"
            )
        bounds = [sum(split[:i]) for i in range(pp + 1)]
        replicas = []
        for d in range(dp):
            stages = []
            for i in range(pp):
                base = tp * (i + pp * d)
                stages.append(build_stage(model, devices[base : base + tp], (bounds[i], bounds[i + 1])))
            replicas.append(tuple(stages))
        return cls(model, tuple(replicas), (microbatches,) * dp, schedule)
