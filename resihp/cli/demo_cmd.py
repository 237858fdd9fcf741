"""`resihp demo`: the embedded default job, simulated (no GPU, no downloads).

A paper-sized job: LLaMA 2-70B on 256 simulated A100s at (TP 4, DP 4, PP 16), 1F1B, 8K-token
packed micro-batches of GitHub-like lengths, with one medium fail-slow and one fail-stop, under
every built policy, printed as a table.
"""

from __future__ import annotations

from resihp.core.files import check_outputs
from resihp.core.scenario import loads_scenario
from resihp.sched.registry import POLICIES

from .common import write_json
from .simulate_cmd import print_results, simulate_policies

DEMO_SCENARIO = """
name = "demo-llama2-70b-256gpu"
[model]
preset = "llama2-70b"
[cluster]
nodes = 32
gpus_per_node = 8
gpu = "a100-80g"
[parallel]
tp = 4
pp = 16
dp = 4
schedule = "1f1b"
microbatches = 32
seq_len = 8192
[workload]
lengths = "github"
seed = 0
[run]
duration_s = 7200
[[faults]]
kind = "slow"
at_s = 900
device = 37
severity = 0.45
[[faults]]
kind = "stop"
at_s = 3600
device = 130
"""


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="simulate the embedded 256-GPU demo under every policy")
    p.add_argument("--json", dest="json_out", help="write results as JSON")
    p.set_defaults(run=run)


def run(args) -> int:
    check_outputs({"--json": args.json_out}, stdout=("--json",))
    scenario = loads_scenario(DEMO_SCENARIO)
    policies = list(POLICIES)
    print("resihp demo: LLaMA 2-70B, 256 simulated A100-80GB, (TP 4, DP 4, PP 16), 1F1B, 2 h;")
    print("  t = 900 s: device 37 slows to 0.45x; t = 3600 s: device 130 stops.")
    result = simulate_policies(scenario, policies, seed=0)
    print_results(result)
    if args.json_out:
        write_json(result, args.json_out)
    return 0
