"""`resihp plan SCENARIO`: the plan a policy holds at a time, its predicted speed and memory."""

from __future__ import annotations

import math

from resihp.core.files import check_outputs
from resihp.core.scenario import load_scenario
from resihp.core.transfer_plan import plan_transfer
from resihp.evaluator.pipeline import write_trace
from resihp.evaluator.predict import predict
from resihp.sim.job import fault_free_samples_per_s, plan_at
from resihp.sim.timing import PlanTimer

from .common import check_policy, gib, table, write_json


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="show the plan, predicted iteration time, memory and samples/s")
    p.add_argument("scenario", help="scenario TOML (architecture §5.1)")
    p.add_argument(
        "--at-s", type=float, default=None, help="time at which to show the plan (after faults up to it)"
    )
    p.add_argument("--policy", default="resihp", help="policy holding the plan (with --at-s)")
    p.add_argument("--json", dest="json_out", help="write the plan as JSON (architecture §5.3)")
    p.add_argument("--trace", help="write a Chrome trace of one simulated iteration")
    p.set_defaults(run=run)


def plan_state(scenario, policy: str | None, at_s: float | None):
    """(plan, cluster) at `at_s` under `policy`; the initial plan when at_s is None."""
    job = scenario.job
    if at_s is None:
        return job.initial_plan(), job.cluster
    check_policy(policy)

    return plan_at(scenario, policy, at_s)


def transition(initial, plan, cluster) -> dict:
    """The state transfer from the scenario's fault-free plan into `plan` when the devices dead in
    `cluster` lost their shards (`core.transfer_plan`: bytes of parameters and both fp32 AdamW
    moments); `lost` names a range no live device holds any more."""
    alive = [d for d in initial.devices() if cluster.alive[d]]
    try:
        figures = plan_transfer(initial, plan, alive, node_of=cluster.node_of).figures()
    except ValueError as e:
        return {"from": "fault-free plan", "lost": str(e)}
    return {"from": "fault-free plan", **figures}


def run(args) -> int:
    check_outputs({"--json": args.json_out, "--trace": args.trace}, stdout=("--json",))
    if args.at_s is not None and not 0 <= args.at_s < math.inf:
        raise ValueError(f"--at-s {args.at_s}: must be a finite number of seconds >= 0")
    scenario = load_scenario(args.scenario)
    job = scenario.job
    plan, cluster = plan_state(scenario, args.policy, args.at_s)
    if plan is None:
        print(f"{args.policy}: the job has aborted by t = {args.at_s} s")
        return 1
    hung = sorted(d for d in plan.devices() if not cluster.alive[d])
    if hung:
        print(f"{args.policy}: at t = {args.at_s} s the plan still uses dead device(s) {hung} "
              "(not yet detected): the job waits")  # fmt: skip
        return 1
    pred = predict(job, plan, cluster)
    x0 = fault_free_samples_per_s(job, PlanTimer(job, job.workload.seed))  # as `resihp simulate`
    bound = x0 * cluster.capacity() / cluster.num_devices
    rows = []
    for d, stages in enumerate(plan.replicas):
        for i, st in enumerate(stages):
            mem = max((pred.peak_memory_bytes.get(dev, 0.0) for dev in st.devices), default=0.0)
            rows.append([d, i, f"{st.layers[0]}-{st.layers[1] - 1}", list(st.devices) or "hollow",
                         list(st.tp_split), gib(mem)])  # fmt: skip
    print(
        f"scenario {scenario.name}: {job.model.name} on {cluster.num_devices} x {cluster.gpu}, "
        f"schedule {plan.schedule}, {plan.global_microbatches} micro-batches "
        f"of {job.workload.seq_len} tokens"
    )
    print(table(rows, ["replica", "stage", "layers", "devices", "tp_split (heads)", "peak GiB"]))
    dead = [d for d in range(cluster.num_devices) if not cluster.alive[d]]
    if plan.assignment:
        print(f"migrated chunks (src replica, micro-batch, stage -> replica): {len(plan.assignment)}")
    print(f"predicted iteration: {pred.iteration_s:.3f} s   samples/s: {pred.samples_per_s:.3f}   "
          f"capacity bound: {bound:.3f}   standby: {list(plan.standby)}   dead: {dead}")  # fmt: skip
    if args.json_out:
        out = {
            "scenario": scenario.name,
            "policy": args.policy if args.at_s is not None else "initial",
            "at_s": args.at_s if args.at_s is not None else 0.0,
            **plan.to_dict(),
            "dead": dead,
            "predicted_iteration_s": round(pred.iteration_s, 6),
            "samples_per_s": round(pred.samples_per_s, 6),
            "capacity_bound_samples_per_s": round(bound, 6),
            "peak_memory_bytes": {str(k): round(v) for k, v in sorted(pred.peak_memory_bytes.items())},
            "transfer": transition(job.initial_plan(), plan, cluster),
        }
        write_json(out, args.json_out)
    if args.trace:
        write_trace(pred.program, predict(job, plan, cluster, keep_spans=True).result, args.trace)
        print(f"trace written to {args.trace} (open in chrome://tracing or ui.perfetto.dev)")
    return 0
