"""`build_costs`: the analytical cost model in the linear form the pipeline simulator evaluates.

Every chunk of a group (replica d, stage i) takes `c0 + alpha·N + beta·Σl²` seconds (rows F, B, W).
Per device k of the group, its work is its query-head share of the attention (QKV/O projections and
the attention core) plus its FFN-column share of the SwiGLU matrices, the vocabulary-parallel LM
head split evenly on the last stage, plus memory-bound per-token work (norms, residuals, rotary,
SwiGLU activation, embedding lookup, fp32 softmax of the logits) at HBM bandwidth. Its time is that
divided by `cluster.speed[k]`. A TP group runs at its slowest member: the chunk row is the one of
the device that is slowest at the batch's mean N and mean Σl² (a max of linear forms is not linear,
so one device is picked per group and kind and the form stays exact for it). Exposed TP
collectives are added to F and B (none in W). `Hardware.layer_overhead_s` (0 on the GPU presets)
adds a fixed cost per layer to F and B, divided by the device's speed but not by its TP share.

Cached per distinct (layers, first/last, split, speeds, TP ring): a uniform 16,384-GPU plan has a
handful of distinct stage shapes, so building its costs costs little more than walking its groups.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from resihp.core.cluster import Cluster
from resihp.core.costs import Costs
from resihp.core.model_spec import ModelSpec
from resihp.core.plan import Plan
from resihp.core.segments import grad_segments

from . import flops, memory
from .comm import Links, dp_ring, pp_transfer_s, ring_allreduce_s, tp_comm_coeffs
from .hardware import Hardware, hardware_preset

# Megatron DDP's default gradient bucket: max(40M, 1M x dp) parameters; only the last one is exposed.
BUCKET_PARAMS, BUCKET_PARAMS_PER_DP = 40_000_000, 1_000_000
STEP_BYTES_PER_PARAM = 30.0  # Adam: read grad fp32 (4), read+write master/m/v (24), write bf16 weight (2)


def resolve_hardware(hardware: Hardware | str | None, cluster: Cluster) -> Hardware:
    if hardware is None:
        return hardware_preset(cluster.gpu)
    if isinstance(hardware, str):
        return hardware_preset(hardware)
    return hardware


def _elementwise_bytes_per_token(model: ModelSpec, tp: int, hs: np.ndarray, fs: np.ndarray) -> np.ndarray:
    """HBM bytes of one layer's memory-bound forward work per token, per device (rough).

    RMSNorm x2 and residual adds on the sequence-parallel shard (~12·h values read or written),
    rotary and softmax statistics on q/k (~2·(h + 2·n_kv·d_h) per head share), SwiGLU's activation
    (~3·F per FFN share); bf16, read plus write.
    """
    h, kv = model.hidden, model.kv_heads * model.head_dim
    return 2 * 2.0 * (12.0 * h / tp + 2.0 * (h + 2 * kv) * hs + 3.0 * model.ffn * fs)


@lru_cache(maxsize=4096, typed=True)
def _chunk_table(model, hw, num_layers, first, last, tp_split, ffn_split, speeds, n_mean, sq_mean, c_att):
    """(3, 3) compute-only table of the slowest device of a group at the typical batch (memoised:
    a pure function of its arguments, the same for most groups of every plan of a replan;
    read-only, callers copy before adding to it)."""
    tp = len(tp_split)
    hs = np.asarray(tp_split, dtype=np.float64) / model.heads
    fs = np.asarray(ffn_split, dtype=np.float64) / model.ffn
    sp = np.asarray(speeds, dtype=np.float64)
    x = hw.achieved_flops
    lin = num_layers * (flops.attn_proj_flops_per_token(model) * hs + flops.mlp_flops_per_token(model) * fs)
    att = num_layers * flops.attn_core_flops_per_sq(model, c_att) * hs
    ew = num_layers * _elementwise_bytes_per_token(model, tp, hs, fs) / hw.hbm_bw
    if first:
        ew = ew + 2 * 2.0 * model.hidden / tp / hw.hbm_bw  # embedding gather, sequence shard
    logit = flops.logits_flops_per_token(model) / tp if last else 0.0
    softmax = 3 * 4.0 * model.vocab / tp / hw.hbm_bw if last else 0.0  # fp32 logits: write, read, grad
    table = np.zeros((3, 3))
    ew_factor = (1.0, 2.0, 0.0)
    fixed = num_layers * hw.layer_overhead_s / sp  # per device; F and B only
    for kind, (f_lin, f_att, f_logit) in enumerate(flops.KIND_FACTORS):
        alpha = (f_lin * lin + f_logit * logit) / x + ew_factor[kind] * ew + (softmax if kind < 2 else 0.0)
        beta = f_att * att / x
        alpha, beta = alpha / sp, beta / sp
        c0 = fixed if kind < 2 else np.zeros_like(sp)
        k = int(np.argmax(c0 + alpha * n_mean + beta * sq_mean))
        table[kind] = (c0[k], alpha[k], beta[k])
    table.setflags(write=False)
    return table


def build_costs(
    model: ModelSpec,
    plan: Plan,
    cluster: Cluster,
    tokens: np.ndarray,
    sum_sq: np.ndarray,
    hardware: Hardware | str | None = None,
    *,
    c_att: float = flops.C_ATT_TIME,
    optimizer: str = "distopt-fp32",
    sequence_parallel: bool = True,
    send_blocks: bool = True,
    tp_exposed: float = 1.0,
    dp_exposed_fraction: float | None = None,
    vocab_parallel: bool = True,
) -> Costs:
    """Chunk times, transfer times, gradient sync, optimizer step and memory of `plan` on `cluster`.

    - `hardware`: a Hardware, a preset name, or None for `hardware_preset(cluster.gpu)`.
    - `c_att`: attention FLOPs convention for time (1/2: causal kernel).
    - `optimizer`: model-state scheme of memory.OPTIMIZERS (default distributed optimizer with fp32
      gradients, sharded over the groups holding the same layers: a gradient segment's holders).
    - `tp_exposed`: fraction of TP collective time not overlapped with compute (default all).
    - `dp_exposed_fraction`: exposed fraction of a gradient segment's all-reduce; default None = the
      last bucket only (`_gradient_sync`).
    - `send_blocks`: a PP send occupies the sender's compute stream (baselines.md §2.1).
    - `vocab_parallel`: embedding and LM head split over the TP group (Megatron, default) or held
      whole by every rank (this repository's runtime); see `memory.shard_params`.
    """
    hw = resolve_hardware(hardware, cluster)
    tokens = np.asarray(tokens, dtype=np.float64)
    sum_sq = np.asarray(sum_sq, dtype=np.float64)
    assert tokens.shape == sum_sq.shape == (plan.global_microbatches,), "one entry per global micro-batch"
    n_mean, sq_mean, t_max = float(tokens.mean()), float(sum_sq.mean()), float(tokens.max())
    links = Links(cluster, hw)
    speed, alive = cluster.speed, cluster.alive
    memory.bytes_per_param(optimizer, 1)  # validates the name
    segments = grad_segments(plan)
    parts = stage_parts(segments)

    chunk: dict[tuple[int, int], np.ndarray] = {}
    mem_static: dict[int, float] = {}
    mem_act: dict[int, float] = {}
    table_cache: dict = {}
    mem_cache: dict = {}
    tp_cache: dict = {}
    with_tp: dict = {}  # (table key, TP key) -> the group's table with its TP collectives
    for d, stages in enumerate(plan.replicas):
        for i, st in enumerate(stages):
            if st.hollow:
                continue
            first, last = i == 0, i == len(stages) - 1
            devs = st.devices
            sp = tuple(speed[k] for k in devs)
            assert all(alive[k] for k in devs), f"group {(d, i)} uses a dead device: {devs}"
            key = (st.num_layers, first, last, st.tp_split, st.ffn_split, sp)
            plain = not links.devices.intersection(devs)  # no degraded link touches this group
            tp_key = (st.num_layers, len(devs), _one_node(devs, links)) if plain else (st.num_layers, devs)
            table = with_tp.get((key, tp_key))
            if table is None:
                table = table_cache.get(key)
                if table is None:
                    table = table_cache[key] = _chunk_table(model, hw, *key, n_mean, sq_mean, c_att)
                tp_c = tp_cache.get(tp_key)
                if tp_c is None:
                    tp_c = tp_cache[tp_key] = tp_comm_coeffs(model.hidden, st.num_layers, devs, links)
                if tp_c[0] or tp_c[1]:
                    table = table.copy()
                    table[:2, 0] += tp_exposed * tp_c[0]
                    table[:2, 1] += tp_exposed * tp_c[1]
                with_tp[(key, tp_key)] = table
            chunk[(d, i)] = table
            mkey = (st.tp_split, st.ffn_split, parts[(d, i)])
            mem = mem_cache.get(mkey)
            if mem is None:
                mem = mem_cache[mkey] = memory.device_bytes(
                    model, st.tp_split, st.ffn_split, parts[(d, i)], t_max, optimizer, sequence_parallel,
                    vocab_parallel,
                )  # fmt: skip
            for k, (static, act) in zip(devs, mem):
                mem_static[k] = static
                mem_act[k] = act
    sync = _gradient_sync(model, plan, segments, links, hw, optimizer, vocab_parallel, dp_exposed_fraction)
    segment_s, allreduce_bytes, step_s = sync

    act_bytes = n_mean * model.hidden * 2.0
    p2p_cache: dict = {}
    pair_cache: dict = {}

    def p2p(a: tuple[int, int], b: tuple[int, int]) -> float:
        """Seconds to move one micro-batch's activation (or gradient) from group a to group b.
        Cached per pair of groups, and per shape when both lie inside one node each and no degraded
        link touches them (then only the sizes and whether the nodes differ matter)."""
        hit = pair_cache.get((a, b))
        if hit is not None:
            return hit
        send, recv = plan.replicas[a[0]][a[1]].devices, plan.replicas[b[0]][b[1]].devices
        key = (send, recv)
        if _one_node(send, links) and _one_node(recv, links) and not links.devices.intersection(send + recv):
            key = (len(send), len(recv), send[0] // links.gpn == recv[0] // links.gpn)
        if key not in p2p_cache:
            p2p_cache[key] = pp_transfer_s(act_bytes, send, recv, links)
        pair_cache[(a, b)] = p2p_cache[key]
        return pair_cache[(a, b)]

    return Costs(
        tokens=tokens,
        sum_sq=sum_sq,
        chunk=chunk,
        p2p=p2p,
        segment_s=segment_s,
        step_s=step_s,
        mem_static=mem_static,
        mem_act=mem_act,
        send_blocks=send_blocks,
        allreduce_bytes=allreduce_bytes,
    )


def stage_parts(segments) -> dict[tuple[int, int], tuple[tuple[int, bool, bool, int], ...]]:
    """Per holder group: its gradient segments as `memory.device_bytes` parts, in layer order."""
    out: dict = {}
    for seg in segments:
        for g in seg.groups:
            out.setdefault(g, []).append((seg.num_layers, seg.with_embedding, seg.with_head, len(seg.groups)))
    return {g: tuple(v) for g, v in out.items()}


def _gradient_sync(model, plan, segments, links, hw, optimizer, vocab_parallel, dp_exposed_fraction):
    """(exposed seconds per segment, bytes all-reduced per device, optimizer step seconds).

    A sharded segment's TP rank r of every holder joins ring r with its shard; a full segment's
    holder devices form one ring over the unsharded layout. Each device hands its segment's
    elements (x `GRAD_BYTES`) to the all-reduce; a segment with one holder reduces nothing. Only
    the segment's last bucket is exposed (Megatron DDP overlaps the rest with the backward): one
    layer's gradients (plus the embedding when the segment starts at layer 0, whose gradient is
    ready last), capped at max(40M, 1M x ranks) parameters; or `dp_exposed_fraction` of the
    segment's largest shard. The step updates each device's shard of every segment, divided by
    the segment's holders under a sharded optimizer.
    """
    grad_bytes = memory.GRAD_BYTES.get(optimizer, 2)
    sharded_opt = optimizer.startswith(("distopt", "zero"))
    segment_s: dict[tuple[int, int], float] = {}
    allreduce_bytes: dict[int, float] = {}
    local: dict[int, float] = {}  # parameters each device updates at the step
    count_cache: dict = {}

    def counts(n, emb, head, tp_split, ffn_split) -> tuple[float, ...]:
        """`memory.shard_params` of every TP rank of a split (cached per call)."""
        key = (n, emb, head, tp_split, ffn_split)
        if key not in count_cache:
            count_cache[key] = tuple(
                memory.shard_params(model, n, emb, head, tp_split, ffn_split, r, vocab_parallel)
                for r in range(len(tp_split))
            )
        return count_cache[key]

    for seg in segments:
        holders = len(seg.groups)
        n, emb, head = seg.num_layers, seg.with_embedding, seg.with_head
        for st in seg.stages:
            for dev, own in zip(st.devices, counts(n, emb, head, st.tp_split, st.ffn_split)):
                local[dev] = local.get(dev, 0.0) + (own / holders if sharded_opt else own)
        if holders < 2:
            continue
        if seg.sharded:
            st = seg.stages[0]
            splits, ranks = (st.tp_split, st.ffn_split), holders
            bw, alpha = dp_ring([s.devices for s in seg.stages], links)
        else:
            splits, ranks = ((model.heads,), (model.ffn,)), len(seg.devices)
            bw, alpha = links.ring(seg.devices)
        moved = counts(n, emb, head, *splits)
        if dp_exposed_fraction is None:
            layer = max(counts(1, emb, False, *splits))
            exposed = min(layer, max(BUCKET_PARAMS, BUCKET_PARAMS_PER_DP * ranks))
        else:
            exposed = dp_exposed_fraction * max(moved)
        segment_s[seg.layers] = ring_allreduce_s(exposed * grad_bytes, ranks, bw, alpha)
        for st in seg.stages:
            for r, dev in enumerate(st.devices):
                allreduce_bytes[dev] = (
                    allreduce_bytes.get(dev, 0.0) + grad_bytes * moved[r if seg.sharded else 0]
                )
    step_s = max(local.values(), default=0.0) * STEP_BYTES_PER_PARAM / hw.hbm_bw
    return segment_s, allreduce_bytes, step_s


def _one_node(devs: tuple[int, ...], links: Links) -> bool:
    return min(devs) // links.gpn == max(devs) // links.gpn


def capacity_bound(fault_free_samples_per_s: float, cluster: Cluster, num_devices_at_start: int) -> float:
    """X_ub = X0 · Σ speed of live devices / N (cost-model.md §10): no policy can beat it."""
    return fault_free_samples_per_s * cluster.capacity() / num_devices_at_start
