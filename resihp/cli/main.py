"""`resihp` entry point: subcommands plan, simulate, demo, policies (detect and train when built).

User errors (bad scenario keys, impossible values, unknown policies) print one line naming the
key, the value and what is allowed, and exit with status 2; no traceback.
"""

from __future__ import annotations

import argparse
import sys

from . import demo_cmd, plan_cmd, report_cmd, simulate_cmd
from .common import POLICY_NAMES, built_policies


def _policies(args) -> int:
    built = built_policies()
    for name in POLICY_NAMES:
        print(f"{name:20s} {'built' if name in built else 'not built yet'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="resihp", description="Resilient hybrid-parallel LLM training: simulate, plan, detect, train."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo_cmd.add_parser(sub)
    plan_cmd.add_parser(sub)
    simulate_cmd.add_parser(sub)
    report_cmd.add_parser(sub)
    sub.add_parser("policies", help="list policy names and which are built").set_defaults(run=_policies)
    for optional in ("resihp.cli.detect_cmd", "resihp.cli.train_cmd"):
        try:
            module = __import__(optional, fromlist=["add_parser"])
        except ImportError:
            continue
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except ValueError as exc:
        print(f"resihp: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("resihp: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
