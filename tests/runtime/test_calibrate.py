"""`calibrate_hardware`: synthetic trace records -> a Hardware whose cost model reproduces them."""

import numpy as np
import pytest

from resihp.core.cluster import Cluster
from resihp.core.model_spec import ModelSpec
from resihp.core.plan import Plan
from resihp.core.trace_format import InstrRow, LinkRow
from resihp.core.workload import Workload
from resihp.cost import build_costs, hardware_preset
from resihp.runtime.adapt.calibrate import calibrate_hardware

SPEC = ModelSpec("t", 4, 32, 8, 2, 48, 256)
WL = Workload(32, 2)
CPU = hardware_preset("cpu")
SCALE, OVERHEAD, ALLREDUCE_S, EXCESS_S = 0.05, 8e-4, 6e-4, 1e-4  # the synthetic runtime's truth


def _chunk_s(costs, plan: Plan, g: tuple[int, int], src: int, j: int, forward: bool) -> float:
    """Compute-only seconds of one F (or B + W) chunk of group g in `costs`."""
    k = plan.mb_offset(src) + j
    t = costs.chunk[g]
    row = t[0] if forward else t[1] + t[2]
    return float(row[0] + row[1] * costs.tokens[k] + row[2] * costs.sum_sq[k])


def _records(plan: Plan, mb_per_s: float, tp_alpha_s: float = 0.0, it: int = 1) -> list[dict]:
    """One iteration's trace records of `plan` on a runtime whose chunks take OVERHEAD per layer plus
    the `cpu` preset's time / SCALE, whose TP all-reduces take `tp_alpha_s` per step, gradient
    all-reduces ALLREDUCE_S, and P2P blocks their nominal time plus EXCESS_S (or EXCESS_S alone)."""
    batch = WL.pack(it, plan.global_microbatches)
    tokens = np.full(batch.count, float(batch.seq_len))
    base = build_costs(SPEC, plan, Cluster(1, 4, CPU), tokens, batch.sum_sq, CPU, tp_exposed=0.0)
    out = []
    for d, stages in enumerate(plan.replicas):
        for i, st in enumerate(stages):
            comm = 4 * st.num_layers * (st.tp - 1) * tp_alpha_s
            for dev in st.devices:
                instrs, links = [], []
                for j in range(plan.microbatches[d]):
                    for op, fwd in (("F", True), ("B", False)):
                        t = OVERHEAD * st.num_layers + _chunk_s(base, plan, (d, i), d, j, fwd) / SCALE
                        instrs.append(InstrRow(op, d, j, t, comm))
                    instrs.append(InstrRow("W", d, j, 0.0, 0.0))
                    if len(stages) > 1:
                        peer = stages[1 - i].devices[0]
                        nbytes = 4 * batch.seq_len * SPEC.hidden
                        wire = nbytes / (mb_per_s * 1e6) if mb_per_s > 0 else 0.0
                        what = "grad" if i == 0 else "act"
                        links.append(LinkRow(peer, dev, what, d, j, nbytes, wire + EXCESS_S))
                instrs.append(InstrRow("ALLREDUCE", -1, -1, 1e-4, ALLREDUCE_S))
                rec = {"iter": it, "generation": 0, "device": dev, "replica": d, "stage": i}
                out.append({**rec, "instrs": instrs, "links": links})
    return out


def test_calibrated_hardware_reproduces_chunk_and_transfer_times():
    """pp2 x dp2 with the link model on: the fitted Hardware's cost model gives every chunk its
    measured compute time, a P2P block its nominal time plus the measured excess (the nominal
    bandwidth is used exactly, fp32 blocks vs the model's bf16 activations), and the collective
    latency is the gradient all-reduce's (2 steps on a 2-ring); fields without samples keep the
    preset's."""
    plan = Plan.uniform(SPEC, 1, 2, 2, 2)
    records = _records(plan, 0.25)
    hw = calibrate_hardware(plan, WL, records, 0.25)
    assert hw.name == "cpu-calibrated" and hw.hbm_bytes == CPU.hbm_bytes and hw.intra_bw == CPU.intra_bw
    assert hw.peak_flops == pytest.approx(CPU.peak_flops * SCALE, rel=1e-6)
    assert hw.layer_overhead_s == pytest.approx(OVERHEAD, rel=1e-6)
    assert hw.p2p_bw == 0.25e6 / 2 and hw.alpha_p2p_s == pytest.approx(EXCESS_S, rel=1e-6)
    assert hw.alpha_intra_s == pytest.approx(ALLREDUCE_S / 2)
    batch = WL.pack(1, 4)
    costs = build_costs(SPEC, plan, Cluster(1, 4, hw), np.full(4, 32.0), batch.sum_sq)
    for rec in records:
        g = (rec["replica"], rec["stage"])
        for row in rec["instrs"]:
            if row.op in ("F", "B"):
                got = _chunk_s(costs, plan, g, row.src, row.mb, row.op == "F")
                assert got == pytest.approx(row.compute_s, rel=1e-6)
        for row in rec["links"]:
            assert costs.p2p((g[0], 1 - g[1]), g) == pytest.approx(row.transfer_s, rel=1e-6)


def test_calibration_ignores_an_outlier_and_falls_back_when_flops_explain_nothing():
    """One chunk 3x too slow (a scheduling hiccup) moves nothing; chunks that all take the same time
    whatever their FLOPs (fixed per-operator costs) keep the preset's FLOP rate and become layer
    overhead."""
    plan = Plan.uniform(SPEC, 1, 2, 2, 2)
    records = _records(plan, 0.0)
    slow = records[1]["instrs"][0]
    records[1]["instrs"][0] = slow._replace(compute_s=3.0 * slow.compute_s)
    hw = calibrate_hardware(plan, WL, records)
    assert hw.peak_flops == pytest.approx(CPU.peak_flops * SCALE, rel=1e-3)
    assert hw.layer_overhead_s == pytest.approx(OVERHEAD, rel=1e-3)
    assert hw.p2p_bw is None and hw.alpha_p2p_s == pytest.approx(EXCESS_S)  # no link model: latency only
    for rec in records:
        rec["instrs"] = [r._replace(compute_s=2e-3) if r.op in ("F", "B") else r for r in rec["instrs"]]
    flat = calibrate_hardware(plan, WL, records)
    assert flat.peak_flops == CPU.peak_flops and 0.9e-3 < flat.layer_overhead_s < 1e-3


def test_tp_groups_calibrate_the_collective_latency():
    """tp2 x pp1 x dp2: the TP all-reduces inside F and B (4 per layer per TP step) set the latency
    per collective step, not the gradient all-reduce."""
    plan = Plan.uniform(SPEC, 2, 1, 2, 2)
    hw = calibrate_hardware(plan, WL, _records(plan, 0.0, tp_alpha_s=2e-4))
    assert hw.alpha_intra_s == pytest.approx(2e-4, rel=0.02) and hw.alpha_inter_s == hw.alpha_intra_s
    assert hw.layer_overhead_s == pytest.approx(OVERHEAD, rel=1e-3)
