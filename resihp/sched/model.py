"""The scheduler's fast analytic view of a plan: group speeds, per-layer costs, memory, a Costs table.

Planning needs thousands of cheap "how long does this stage take" questions, so this module reduces
the cost model (resihp.cost.flops, .memory, .hardware) to a few numbers:

- a TP group's *speed* relative to one healthy device: the group runs at the pace of its device
  with the most work per unit speed, speed = 1 / max_i (a·h_i/H + (1 - a)·f_i/F) / p_i, with `a`
  the attention share of the layer FLOPs (as resihp.cost.build does). An even split over k devices
  gives k·min p (the paper's §4.1 model); a split in proportion to speed gives about Σ p;
- stage work in *layer units*: every layer costs 1, the LM head `head_layers(model)` on the last
  stage (embedding lookups are memory-bound and counted as 0);
- memory: the simulator's own formula (`memory.device_bytes`) and live counts (`core.schedule`), so
  the memory check and the simulator's peak memory agree (a property test checks it).
"""

from __future__ import annotations

from functools import lru_cache

from resihp.core.plan import Plan, Stage
from resihp.core.program import compile_plan
from resihp.core.schedule import get_schedule
from resihp.core.segments import grad_segments
from resihp.cost import flops, memory
from resihp.cost.build import stage_parts
from resihp.cost.hardware import hardware_preset

_MEMO: dict = {}
# A global batch of this many micro-batches averages the packing's length variation by itself: the
# job simulator's timer (sim/timing.py) and `resihp`'s pricing then use one packed batch, not three.
SPREAD_MICROBATCHES = 256


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
    """Micro-batches a group holds activations for at its peak: the Schedule's own count."""
    return get_schedule(schedule).live(n, stage, num_stages)


def live_bound(schedule: str, counts, stage: int, num_stages: int) -> int:
    """Most micro-batches a group at `stage` of `num_stages` keeps live when it runs `counts` (one
    chunk count per source pipeline). The compiled order of a migrated plan lets each source keep
    at most its own template's `Schedule.live` live (the list scheduler's per-source limit,
    `core.program._greedy_orders`), so the sum bounds the compiled count; with one source (no
    migration) it is the Schedule's count exactly."""
    sched = get_schedule(schedule)
    return sum(sched.live(n, stage, num_stages) for n in counts if n > 0)


def device_memory(job, stage: Stage, index: int, num_stages: int, chunks: int, dp: int) -> dict[int, float]:
    """Peak bytes per device of `stage` (position `index` of `num_stages`) running `chunks` chunks
    under `job.schedule`, its layers held by `dp` groups (`memory.device_bytes`).

    The planners' estimate before a plan exists: the chunks live as the Schedule keeps one
    pipeline's. Exact for a stage without migrated-in work; with it, the list scheduler may keep
    more live (up to `Schedule.live` per source pipeline), which `plan_memory` of the plan sees.
    """
    live = n_live(job.schedule, chunks, index, num_stages)
    parts = ((stage.num_layers, index == 0, index == num_stages - 1, dp),)
    mem = memory.device_bytes(job.model, stage.tp_split, stage.ffn_split, parts, job.workload.seq_len)
    return {d: static + live * act for d, (static, act) in zip(stage.devices, mem)}


def plan_memory(job, plan: Plan, exact: bool = True) -> dict[int, float]:
    """Peak bytes per device of `plan`: what the simulator reports as its peak memory, by the same
    formula (`memory.device_bytes` over the plan's gradient segments) and the same live counts
    (the Schedule's for template orders; the compiled Program's for migrated plans).

    `exact=False` bounds a migrated plan's live counts without compiling it: the list scheduler
    keeps at most `Schedule.live` of each source pipeline's chunks live at a group, so the sum
    over sources is an upper bound (equal to the exact count for plans without migration)."""
    parts = stage_parts(grad_segments(plan))
    if plan.assignment and exact:
        live = compile_plan(plan).live_peaks()
    else:
        live = {
            (d, i): live_bound(plan.schedule, by_src.values(), i, len(plan.replicas[d]))
            for (d, i), by_src in chunk_counts(plan).items()
        }
    out = {}
    cache: dict = {}
    for d, stages in enumerate(plan.replicas):
        for i, st in enumerate(stages):
            if st.hollow:
                continue
            key = (st.tp_split, st.ffn_split, parts[(d, i)])
            if key not in cache:
                cache[key] = memory.device_bytes(job.model, *key, job.workload.seq_len)
            n = live.get((d, i), 0)
            for dev, (static, act) in zip(st.devices, cache[key]):
                out[dev] = static + n * act
    return out


def chunk_counts(plan: Plan) -> dict[tuple[int, int], dict[int, int]]:
    """Per group (replica, stage): how many chunks of each source replica it runs."""
    count: dict[tuple[int, int], dict[int, int]] = {}
    for d, stages in enumerate(plan.replicas):
        for i in range(len(stages)):
            count[(d, i)] = {d: plan.microbatches[d]}
    for src, _, i, dst in plan.assignment:
        count[(src, i)][src] -= 1
        count[(dst, i)][src] = count[(dst, i)].get(src, 0) + 1
    return count


def chunk_memory_check(job, plan):
    """`mem_ok(group, counts)` for the migration planners: whether group (replica, stage) of
    `plan` (a Plan or a layout.Draft, before its moves) stays within usable HBM while it runs
    `counts[src]` chunks of each source replica src.

    The formula of `plan_memory` for the plan the moves give (its gradient segments' parts, the
    live count `live_bound`): a plan built only from moves this check accepts passes
    `fits_memory` without being compiled."""
    parts = stage_parts(grad_segments(plan))
    cap = usable_bytes(job)
    bytes_of: dict = {}

    def mem_ok(g, counts) -> bool:
        d, i = g
        st = plan.replicas[d][i]
        if st.hollow:
            return False
        key = (st.tp_split, st.ffn_split, parts[g])
        if key not in bytes_of:
            bytes_of[key] = memory.device_bytes(job.model, *key, job.workload.seq_len)
        live = live_bound(job.schedule, counts.values(), i, len(plan.replicas[d]))
        return all(static + live * act <= cap for static, act in bytes_of[key])

    return mem_ok


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


def fits_memory(job, plan: Plan) -> bool:
    """Every device of `plan` within usable HBM at its peak (`plan_memory`), migrated-in
    micro-batches included. A migrated plan is compiled only when its bound does not fit."""
    cap = usable_bytes(job)
    if plan.assignment and max(plan_memory(job, plan, exact=False).values(), default=0.0) <= cap:
        return True
    return max(plan_memory(job, plan).values(), default=0.0) <= cap


def iteration_time(job, plan: Plan, cluster, evaluator: str = "auto", iterations=(0,), **options) -> float:
    """Predicted iteration seconds (`resihp.evaluator.predict`, the ITP with the analytical cost model)
    under cost `options`, the mean over the packed batches of `iterations`. `evaluator`: "auto" or
    "predict", the same (the policies' option; there is no other path)."""
    if evaluator not in ("auto", "predict"):
        raise ValueError(f"evaluator = {evaluator!r}: allowed: auto, predict")
    from resihp.evaluator.predict import predict

    return sum(predict(job, plan, cluster, it, **options).iteration_s for it in iterations) / len(iterations)
