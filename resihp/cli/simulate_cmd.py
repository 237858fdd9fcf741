"""`resihp simulate SCENARIO --policy P ...`: the job over time under each policy (§5.2)."""

from __future__ import annotations

import sys

from resihp.core.files import check_outputs
from resihp.core.scenario import load_scenario

from .common import check_policy, table, write_json


def add_parser(sub) -> None:
    p = sub.add_parser("simulate", help="simulate a scenario's faults under one or more policies")
    p.add_argument("scenario", help="scenario TOML (architecture §5.1)")
    p.add_argument("--policy", action="append", default=None, help="policy name; repeat for several")
    p.add_argument("--seed", type=int, default=0, help="seed of generated faults and detector noise")
    p.add_argument("--json", dest="json_out", help="write results as JSON (architecture §5.2)")
    p.add_argument("--plot", help="write the throughput timeline per policy as a PNG")
    p.set_defaults(run=run)


def print_results(result: dict) -> None:
    base = result["fault_free_samples_per_s"]
    rows = []
    for name, run_ in result["policies"].items():
        sps = run_["samples_per_s"]
        bound = run_["capacity_bound_samples_per_s"]
        status = f"aborted at {run_['abort_t_s']:.0f} s" if run_["aborted"] else "ok"
        rows.append([name, f"{sps:.3f}", f"{sps / base:.3f}", f"{sps / bound:.3f}" if bound else "-",
                     len(run_["events"]), status])  # fmt: skip
    print(f"scenario {result['scenario']}: fault-free {base:.3f} samples/s")
    print(table(rows, ["policy", "samples/s", "x fault-free", "x capacity bound", "events", "status"]))


def simulate_policies(scenario, policies: list[str], seed: int) -> dict:
    for name in policies:
        check_policy(name)
    from resihp.sim.compare import simulate_scenario

    if sys.stderr.isatty():
        print(f"  simulating {len(policies)} policies ...", file=sys.stderr, flush=True)
    return simulate_scenario(scenario, policies, seed)


def run(args) -> int:
    check_outputs({"--json": args.json_out, "--plot": args.plot}, stdout=("--json",))
    scenario = load_scenario(args.scenario)
    result = simulate_policies(scenario, args.policy or ["none"], args.seed)
    print_results(result)
    if args.json_out:
        write_json(result, args.json_out)
    if args.plot:
        from resihp.sim.plot import plot_timeline

        plot_timeline(result, args.plot)
        print(f"timeline plot written to {args.plot}")
    return 0
