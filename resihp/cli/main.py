"""`resihp` entry point: subcommands demo, plan, simulate, policies, detect, train, export, data.

User errors (bad scenario keys, impossible values, unknown policies) print one line naming the
key, the value and what is allowed, and exit with status 2; no traceback. SIGINT and SIGTERM end
any command with one line, `resihp: interrupted` (exit 130) / `resihp: terminated` (143); while
`resihp train` runs its job, the runtime takes both over and stops the job in order
(`runtime/control/signals.py`, `train_cmd.stopped`).
"""

from __future__ import annotations

import argparse
import atexit
import gc
import signal
import sys
import threading

from resihp.sched.registry import POLICIES, describe

from . import (
    agent_cmd,
    controller_cmd,
    data_cmd,
    demo_cmd,
    detect_cmd,
    export_cmd,
    plan_cmd,
    report_cmd,
    simulate_cmd,
    train_cmd,
)


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
    controller_cmd.add_parser(sub)
    agent_cmd.add_parser(sub)
    export_cmd.add_parser(sub)
    data_cmd.add_parser(sub)
    return parser


class Terminated(BaseException):
    """SIGTERM, raised in the main thread as KeyboardInterrupt is for SIGINT."""


def _terminate(signum, frame) -> None:
    raise Terminated


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # The interpreter's teardown collects every object; over torch's millions (`resihp train`) that
    # took ~1 s of a 2-core machine after the job had ended. Frozen at exit, they are skipped.
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
    main_thread = threading.current_thread() is threading.main_thread()  # (signals reach only it)
    previous = signal.signal(signal.SIGTERM, _terminate) if main_thread else None
    try:
        return args.run(args)
    except ValueError as exc:
        print(f"resihp: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("resihp: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    except Terminated:
        print("resihp: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
