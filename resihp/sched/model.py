"""The scheduler's fast analytic view of a plan: group speeds, per-layer costs, memory, a Costs table.

Planning needs thousands of cheap "how long does this stage take" questions, so this module reduces
the cost model (resihp.cost.flops, .memory, .hardware) to a few numbers:

- a TP group's *speed* relative to one healthy device: the group runs at the pace of its device
  with the most work per unit speed, speed = 1 / max_i (a·h_i/H + (1 - a)·f_i/F) / p_i, with `a`
  the attention share of the layer FLOPs (as resihp.cost.build does). An even split over k devices
  gives k·min p (the paper's §4.1 model); a split in proportion to speed gives about Σ p;
- stage work in *layer units*: every layer costs 1, the LM head `head_layers(model)` on the last
  stage (embedding lookups are memory-bound and counted as 0);
- `plan_costs` builds the core Costs table the pipeline DAG evaluates, so `estimate` is a full ITP
  pass with the same chunk order as the real schedule.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from resihp.core.costs import Costs
from resihp.core.plan import Plan, Stage
from resihp.cost import flops, memory
from resihp.cost.hardware import hardware_preset
from resihp.sim.pipeline import compile_plan, evaluate

_MEMO: dict = {}


def job_key(job) -> tuple:
    """What the memory caches below depend on (model, tokens, schedule, hardware); cheap to hash
    (not the PlanningContext, whose plan and cluster hold per-device tuples that Python re-hashes
    on every lookup)."""
    return (job.model, job.workload, job.schedule, job.cluster.gpu)


def memo(key, build):
    """A bounded memo for pure planning results keyed by `key`."""
    if key not in _MEMO:
        if len(_MEMO) > 8192:
            _MEMO.clear()
        _MEMO[key] = build()
    return _MEMO[key]


@lru_cache(maxsize=64)
def attn_share(model) -> float:
    """Fraction of a layer's linear FLOPs in the attention projections (split by heads)."""
    a = flops.attn_proj_flops_per_token(model)
    return a / (a + flops.mlp_flops_per_token(model))


def head_layers(model) -> float:
    """LM-head cost in layer units (per token, linear terms only)."""
    return flops.logits_flops_per_token(model) / flops.linear_flops_per_token(model)


def group_speed(model, stage: Stage, speed: tuple[float, ...]) -> float:
    """Throughput of a TP group relative to one healthy device; 0 for a hollow stage."""
    if stage.hollow:
        return 0.0
    a = attn_share(model)
    worst = max(
        (a * h / model.heads + (1.0 - a) * f / model.ffn) / speed[d]
        for d, h, f in zip(stage.devices, stage.tp_split, stage.ffn_split)
    )
    return 1.0 / worst


def stage_work(model, num_layers: int, last: bool) -> float:
    return num_layers + (head_layers(model) if last else 0.0)


def pipeline_key(stages, m: int, cluster) -> tuple:
    """What one pipeline's time depends on: layers, group sizes and speeds, node crossings, slow links."""
    devs = {x for st in stages for x in st.devices}
    return (
        m,
        tuple((st.layers, st.tp, min(cluster.speed[x] for x in st.devices)) for st in stages),
        tuple(cluster.same_node(a.devices[0], b.devices[0]) for a, b in zip(stages, stages[1:])),
        tuple(link for link in cluster.links if link[0] in devs or link[1] in devs),
    )


def n_live(schedule: str, n: int, stage: int, num_stages: int) -> int:
    """Micro-batches a group holds activations for at its peak (compile_plan's order)."""
    if schedule == "gpipe":
        return n
    return min(num_stages - stage, n)


def device_memory(job, stage: Stage, index: int, num_stages: int, chunks: int, dp: int) -> dict[int, float]:
    """Peak bytes per device of `stage` (position `index` of `num_stages`) running `chunks` mbs."""
    model = job.model
    first, last = index == 0, index == num_stages - 1
    live = n_live(job.schedule, chunks, index, num_stages)
    tokens = job.workload.seq_len
    bpp = memory.bytes_per_param("distopt-fp32", dp)
    out = {}
    for d, h, f in zip(stage.devices, stage.tp_split, stage.ffn_split):
        hs, fs = h / model.heads, f / model.ffn
        params = memory.device_params(model, stage.num_layers, first, last, stage.tp, hs, fs)
        act = memory.activation_bytes_per_token(model, stage.tp, hs, fs) * tokens * stage.num_layers
        logits = memory.logits_bytes(model, tokens, stage.tp) if last else 0.0
        out[d] = params * bpp + live * act + logits
    return out


def usable_bytes(job) -> float:
    return memory.usable_bytes(hardware_preset(job.cluster.gpu))


def max_layers(job, stage: Stage, index: int, num_stages: int, chunks: int, dp: int) -> int:
    """Most layers `stage`'s devices (with its TP split) hold at position `index` within memory."""
    if stage.hollow:
        return 0
    live = n_live(job.schedule, chunks, index, num_stages)
    return _max_layers(job, stage.tp_split, stage.ffn_split, index, num_stages, live, dp)


def _max_layers(job, tp_split, ffn_split, index, num_stages, live, dp) -> int:
    key = ("max_layers", job_key(job), tp_split, ffn_split, index, num_stages, live, dp)
    return memo(key, lambda: _max_layers_uncached(job, tp_split, ffn_split, index, num_stages, live, dp))


def _max_layers_uncached(job, tp_split, ffn_split, index, num_stages, live, dp) -> int:
    devs = tuple(range(len(tp_split)))
    cap = usable_bytes(job)
    zero = device_memory(job, Stage(devs, (0, 0), tp_split, ffn_split), index, num_stages, live, dp)
    one = device_memory(job, Stage(devs, (0, 1), tp_split, ffn_split), index, num_stages, live, dp)
    return max(0, int(min((cap - zero[d]) // (one[d] - zero[d]) for d in devs)))


def chunk_counts(plan: Plan) -> dict[tuple[int, int], int]:
    """Chunks each group (replica, stage) runs: its own micro-batches, less and plus migrations."""
    load = {
        (d, i): plan.microbatches[d] for d, stages in enumerate(plan.replicas) for i in range(len(stages))
    }
    for src, _, i, dst in plan.assignment:
        load[(src, i)] -= 1
        load[(dst, i)] += 1
    return load


def fits_memory(job, plan: Plan) -> bool:
    """Every device of every stage within usable HBM, counting migrated-in micro-batches."""
    load = chunk_counts(plan)
    for d, stages in enumerate(plan.replicas):
        for i, st in enumerate(stages):
            if st.hollow:
                continue
            live = n_live(job.schedule, load[(d, i)], i, len(stages))
            if st.num_layers > _max_layers(job, st.tp_split, st.ffn_split, i, len(stages), live, plan.dp):
                return False
    return True


def plan_costs(job, plan: Plan, cluster, iteration: int = 0) -> Costs:
    """A Costs table for `plan`: chunk times from FLOPs ÷ group speed, P2P over NVLink or IB."""
    model = job.model
    hw = hardware_preset(cluster.gpu)
    batch = job.workload.pack(iteration, plan.global_microbatches)
    tokens = np.full(batch.count, float(batch.seq_len))
    per_tok = flops.linear_flops_per_token(model)
    per_sq = flops.attn_core_flops_per_sq(model)
    logit = flops.logits_flops_per_token(model)
    act_bytes = 2.0 * batch.seq_len * model.hidden
    chunk = {}
    for d, stages in enumerate(plan.replicas):
        for i, st in enumerate(stages):
            if st.hollow:
                continue
            last = i == len(stages) - 1
            rate = hw.achieved_flops * group_speed(model, st, cluster.speed)
            lin = (st.num_layers * per_tok + (logit if last else 0.0)) / rate
            att = st.num_layers * per_sq / rate
            k = st.tp
            tp_comm = 0.0 if k == 1 else 2 * (2 * (k - 1) / k * act_bytes / hw.intra_bw) * st.num_layers
            c0 = tp_comm + st.num_layers * hw.layer_overhead_s / min(cluster.speed[x] for x in st.devices)
            chunk[(d, i)] = np.array([[c0, lin, att], [c0, lin, 2 * att], [0.0, lin, 0.0]])

    def p2p(a, b) -> float:
        da = plan.replicas[a[0]][a[1]].devices
        db = plan.replicas[b[0]][b[1]].devices
        if hw.p2p_bw is not None:  # P2P priced apart from the collectives (e.g. a calibrated CPU runtime)
            f = cluster.link_factor(da[0], db[0]) if cluster.links else 1.0
            return act_bytes / min(len(da), len(db)) / (hw.p2p_bw * f) + (hw.alpha_p2p_s or 0.0)
        if cluster.same_node(da[0], db[0]):
            return act_bytes / hw.intra_bw
        f = min(cluster.link_factor(x, y) for x in da[:1] for y in db[:1]) if cluster.links else 1.0
        return act_bytes / min(len(da), len(db)) / (hw.inter_bw * f) + hw.alpha_inter_s

    return Costs(tokens, batch.sum_sq, chunk, p2p=p2p)


def estimate(job, plan: Plan, cluster, iteration: int = 0) -> float:
    """Predicted iteration seconds of `plan` under the scheduler's analytic costs."""
    return evaluate(compile_plan(plan), plan_costs(job, plan, cluster, iteration)).iteration_s


def iteration_time(job, plan: Plan, cluster, evaluator: str = "auto") -> float:
    """Predicted iteration seconds: resihp.sim.predict when the cost model is built, else `estimate`."""
    if evaluator in ("auto", "predict"):
        try:
            from resihp.sim.predict import predict
        except ImportError:
            if evaluator == "predict":
                raise
        else:
            return predict(job, plan, cluster).iteration_s
    return estimate(job, plan, cluster)
