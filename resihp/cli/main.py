"""`resihp` entry point: subcommands demo, plan, simulate, policies, detect, train, export, data.

User errors (bad scenario keys, impossible values, unknown policies) print one line naming the
key, the value and what is allowed, and exit with status 2; no traceback.
"""

from __future__ import annotations

import argparse
import sys

from resihp.sched.registry import POLICIES, describe

from . import data_cmd, demo_cmd, detect_cmd, export_cmd, plan_cmd, report_cmd, simulate_cmd, train_cmd


def _policies(args) -> int:
    for name in POLICIES:
        print(f"{name:20s} {describe(name)}")
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
    sub.add_parser("policies", help="list the policy names, one line each").set_defaults(run=_policies)
    detect_cmd.add_parser(sub)
    train_cmd.add_parser(sub)
    export_cmd.add_parser(sub)
    data_cmd.add_parser(sub)
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
