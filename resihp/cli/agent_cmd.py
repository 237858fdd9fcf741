"""`resihp agent --controller HOST:PORT --node-rank K [--devices N] [--advertise ADDR]`: serve one
node of a `resihp controller` job — spawn, watch and fence that node's workers
(`runtime/control/serve.py`). Started by the user or a cluster manager on each machine, never by
the controller (docs/deploy.md)."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser(
        "agent", help="serve one node of a `resihp controller` job (spawn and watch its workers)"
    )
    p.add_argument(
        "--controller", required=True, metavar="HOST:PORT", help="the controller's --listen address"
    )
    p.add_argument(
        "--node-rank", required=True, type=int, metavar="K", help="this node's rank (0..run.nodes-1)"
    )
    p.add_argument(
        "--devices", type=int, metavar="N", help="devices of this node (checked: run.devices_per_node)"
    )
    p.add_argument("--advertise", metavar="ADDR", help="this host's address for the workers' gloo sockets")
    p.add_argument(
        "--wait-s", type=float, default=None, metavar="S",
        help="how long to wait for the controller: at the start (default 60), and for a new one "
        "after losing it (default: the run's run.controller_wait_s)",
    )  # fmt: skip
    p.set_defaults(run=run)


def run(args) -> int:
    from resihp.runtime.control.serve import parse_address, serve

    host, port = parse_address(args.controller, "--controller")
    if args.node_rank < 0:
        raise ValueError(f"--node-rank = {args.node_rank}: must be >= 0")
    if args.devices is not None and args.devices < 1:
        raise ValueError(f"--devices = {args.devices}: must be a positive integer")
    if args.wait_s is not None and not args.wait_s >= 0:
        raise ValueError(f"--wait-s = {args.wait_s}: must be >= 0")
    return serve(host, port, args.node_rank, args.devices, args.advertise, args.wait_s)
