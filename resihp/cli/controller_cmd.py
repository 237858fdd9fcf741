"""`resihp controller --config FILE --listen HOST:PORT [--faults F] [--json OUT] [--trace OUT]
[--checkpoint-every N --checkpoint-dir DIR] [--resume DIR]`: run a job whose node agents run on
other machines (`resihp agent --controller HOST:PORT --node-rank K`, one per node).

It hosts the c10d store at HOST:PORT (HOST as the agents and their workers reach it), waits up to
`run.controller_wait_s` for the `run.nodes` agents (exit 2 naming the nodes that never came),
assigns device d to node d // run.devices_per_node, and runs the job as `resihp train` does (the
same options, output and exit codes; docs/deploy.md)."""

from __future__ import annotations

from . import train_cmd


def add_parser(sub) -> None:
    p = sub.add_parser(
        "controller", help="run a job whose node agents (`resihp agent`) run on other machines"
    )
    train_cmd.add_options(p)
    p.add_argument("--listen", required=True, metavar="HOST:PORT", help="where the agents reach the store")
    p.set_defaults(run=run)


def run(args) -> int:
    from resihp.runtime.control.serve import parse_address

    return train_cmd.run(args, listen=parse_address(args.listen, "--listen"))
