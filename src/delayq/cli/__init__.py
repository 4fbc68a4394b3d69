"""The ``delayq`` command line.

Exit codes: 0 success; 1 the broker refused or could not be reached, the
topology conflicts with what exists, or a check of ``topology verify`` failed;
2 bad input (nothing was sent); 141 the reader of the output went away
(``delayq dlq list | head``), like a command killed by SIGPIPE.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
from collections.abc import Callable, Sequence

from delayq.cli._common import EXIT_BROKER, EXIT_INPUT, EXIT_OK, EXIT_PIPE
from delayq.cli._parser import build_parser
from delayq.cli.parked import cmd_parked
from delayq.cli.run import cmd_demo, cmd_publish, cmd_retry_plan, cmd_stats, cmd_worker
from delayq.cli.spark import cmd_spark_report, cmd_spark_schedule
from delayq.cli.topology import cmd_apply, cmd_export, cmd_grant, cmd_plan, cmd_verify
from delayq.errors import DelayqError, InvalidInput

__all__ = ["EXIT_BROKER", "EXIT_INPUT", "EXIT_OK", "EXIT_PIPE", "build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    try:
        try:
            code = _main(argv)
        finally:  # --help and --version exit through SystemExit: flush for them too
            sys.stdout.flush()  # so a closed pipe shows here, not at the interpreter's exit
    except BrokenPipeError:
        # `delayq dlq list | head`: the reader stopped reading. Point stdout at
        # /dev/null so the interpreter's final flush does not print a traceback.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError, io.UnsupportedOperation):
            pass  # stdout is no real file (a test's capture): nothing will flush it
        return EXIT_PIPE
    return code


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    handlers: dict[tuple[str, str | None], Callable[[argparse.Namespace], int]] = {
        ("topology", "plan"): cmd_plan,
        ("topology", "apply"): cmd_apply,
        ("topology", "export"): cmd_export,
        ("topology", "verify"): cmd_verify,
        ("topology", "grant"): cmd_grant,
        ("stats", None): cmd_stats,
        ("publish", None): cmd_publish,
        ("demo", None): cmd_demo,
        ("retry-plan", None): cmd_retry_plan,
        ("worker", None): cmd_worker,
    }
    handler: Callable[[argparse.Namespace], int]
    if args.command in ("dlq", "unrouted"):
        handler = cmd_parked
    elif args.command == "spark":
        handler = {"schedule": cmd_spark_schedule, "report": cmd_spark_report}[args.spark_command]
    else:
        handler = handlers[(args.command, getattr(args, "topology_command", None))]
    try:
        return handler(args)
    except InvalidInput as exc:
        print(f"delayq: error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except DelayqError as exc:
        print(f"delayq: error: {exc}", file=sys.stderr)
        return EXIT_BROKER
    except KeyboardInterrupt:
        print("delayq: interrupted", file=sys.stderr)
        return 130
