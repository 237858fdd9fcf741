"""Gradient segments: what the gradient reduction of one Plan reduces, and with whom.

The layer axis is cut at every stage boundary of every replica; each piece [lo, hi) is a segment,
held by the non-hollow stages (of all replicas) whose layers contain it. Every holder reduces the
segment's gradients with every other holder, in one of two ways:

- sharded: every holder has the same (tp_split, ffn_split), so TP rank r of each holder holds the
  same shard. After a TP sum of the entries that are partial inside a TP group (norm weights,
  replicated kv rows), the devices of equal TP rank all-reduce their shards (`rank_sets`);
- full: holders split differently. Every holder device writes its contribution into the unsharded
  layout (zeros elsewhere), one all-reduce over all holder devices sums TP partials and replicas
  at once, and each device slices its shard back out.

The embedding travels with the segment that starts at layer 0, the final norm and LM head with the
one that ends at the last layer. Segments are reduced in layer order; for a uniform plan they are
its stages, held by the same stage of every replica. The compiler names them in each group's
ALLREDUCE, the cost model prices them, the simulator times them and the runtime reduces them.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from functools import cached_property

from .plan import Plan, Stage

GroupKey = tuple[int, int]  # (replica, stage)


@dataclass(frozen=True)
class GradSegment:
    layers: tuple[int, int]  # [lo, hi)
    groups: tuple[GroupKey, ...]  # holders, in (replica, stage) order
    stages: tuple[Stage, ...]  # the holders' stages, same order
    with_embedding: bool  # lo == 0: the embedding's gradient is reduced with this segment
    with_head: bool  # hi == the model's last layer: final norm and LM head too

    @property
    def num_layers(self) -> int:
        return self.layers[1] - self.layers[0]

    @cached_property
    def sharded(self) -> bool:
        """Every holder splits heads and FFN columns alike (reduce shard by shard)."""
        return len({(st.tp_split, st.ffn_split) for st in self.stages}) == 1

    @cached_property
    def devices(self) -> tuple[int, ...]:
        return tuple(sorted(dev for st in self.stages for dev in st.devices))

    def rank_sets(self) -> list[tuple[int, ...]]:
        """Per TP rank r: the devices of rank r in every holder (only for a sharded segment)."""
        assert self.sharded, f"segment {self.layers} is not sharded"
        return [tuple(sorted(st.devices[r] for st in self.stages)) for r in range(self.stages[0].tp)]

    def reduce_set(self, device: int) -> tuple[int, ...]:
        """The devices `device` all-reduces this segment with (itself included)."""
        if not self.sharded:
            return self.devices
        for st in self.stages:
            if device in st.devices:
                return self.rank_sets()[st.devices.index(device)]
        raise AssertionError(f"device {device} holds no part of segment {self.layers}")


def grad_segments(plan: Plan) -> tuple[GradSegment, ...]:
    """The plan's gradient segments in layer order (of a Plan: computed once per object, the
    cost model, the memory check and the Program all ask for them; of a planner's draft: anew)."""
    memo = getattr(plan, "_derived", None)
    if memo is None:
        return _grad_segments(plan)
    out = memo.get("segments")
    if out is None:
        out = memo["segments"] = _grad_segments(plan)
    return out


def _grad_segments(plan: Plan) -> tuple[GradSegment, ...]:
    starts = [[st.layers[0] for st in stages] for stages in plan.replicas]
    cuts = sorted({b for stages in plan.replicas for st in stages for b in st.layers})
    last = plan.model.num_layers
    out = []
    for lo, hi in zip(cuts, cuts[1:]):
        groups, stages = [], []
        for d, replica in enumerate(plan.replicas):
            i = bisect_right(starts[d], lo) - 1  # the one stage of replica d holding [lo, hi)
            if not replica[i].hollow:
                groups.append((d, i))
                stages.append(replica[i])
        out.append(GradSegment((lo, hi), tuple(groups), tuple(stages), lo == 0, hi == last))
    return tuple(out)


def tied_embedding_devices(plan: Plan) -> tuple[int, ...]:
    """With tied embeddings: every device holding the embedding or the LM head, sorted (empty
    otherwise). Their sum at STEP — the first holder of each contributing, TP rank 0 — gives both
    copies the full gradient, embedding use plus LM head use, so the copies stay equal."""
    if not plan.model.tie_word_embeddings:
        return ()
    segments = grad_segments(plan)
    return tuple(sorted(set(segments[0].devices) | set(segments[-1].devices)))
