"""The ``delayq`` command line's run: parse, run, map errors to exit codes (see
:mod:`delayq.cli`, which loads this module only once it is asked to run)."""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Sequence

import click

from delayq.cli._common import EXIT_BROKER, EXIT_INPUT, EXIT_INTERRUPTED, EXIT_PIPE, fail
from delayq.cli.app import parse
from delayq.errors import DelayqError, InvalidInput

__all__ = ["run"]


def run(argv: Sequence[str] | None = None) -> int:
    try:
        try:
            code = _main(argv)
        finally:  # --help and --version exit through SystemExit: flush for them too
            sys.stdout.flush()  # so a closed pipe shows here, not at the interpreter's exit
    except BrokenPipeError:
        # `delayq dlq list | head`: the reader stopped reading. Point stdout at
        # /dev/null so the interpreter's final flush does not print a traceback.
        _silence_stdout()
        return EXIT_PIPE
    except OSError as exc:
        # An error no command caught, most often stdout that cannot be written (a full
        # disk: `delayq stats > /dev/full`): said in one line, never a traceback.
        _silence_stdout()
        print(f"delayq: error: {exc.strerror or exc} ({type(exc).__name__})", file=sys.stderr)
        return EXIT_BROKER
    return code


def _silence_stdout() -> None:
    """stdout pointed at /dev/null: the interpreter's last flush of what could not be
    written would print a traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        pass  # stdout is no real file (a test's capture): nothing will flush it


# click 8.2+ raises this for a group given no command (8.1 printed the help, exit 0)
_NO_ARGS: type[click.UsageError] = getattr(
    click.exceptions, "NoArgsIsHelpError", type("_Never", (click.UsageError,), {})
)


def _asks_json(argv: Sequence[str]) -> bool:
    """``--json`` on a command line click refused: its error is printed as JSON too."""
    words = list(argv)
    return "--json" in (words[: words.index("--")] if "--" in words else words)


def _main(argv: Sequence[str] | None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        parsed = parse(words)
    except _NO_ARGS as exc:  # `delayq`, `delayq dlq`: the help, and exit 2 (no command)
        print(exc.format_message(), file=sys.stderr)
        return EXIT_INPUT
    except click.UsageError as exc:
        if exc.ctx is not None:
            print(exc.ctx.get_usage(), file=sys.stderr)
            print(
                f"Try '{exc.ctx.command_path} --help' for help.",
                file=sys.stderr,
            )
        return fail(exc.format_message(), EXIT_INPUT, "UsageError", as_json=_asks_json(words))
    except click.Abort:
        print("delayq: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except SystemExit as exc:
        # click's answer to EPIPE while printing --help: its flush-pacifying wrapper
        # (PacifyFlushWrapper, _PacifyFlushWrapper from 8.2) around stdout, then exit 1
        if "PacifyFlushWrapper" in type(sys.stdout).__name__:
            raise BrokenPipeError from exc
        raise
    if isinstance(parsed, int):  # --help, --version
        return parsed
    as_json = bool(getattr(parsed.args, "json", False))
    try:
        return parsed.run()
    except DelayqError as exc:
        # A command prints its JSON document last, after everything that can raise:
        # one that failed has printed none, and prints the error as one.
        code = EXIT_INPUT if isinstance(exc, InvalidInput) else EXIT_BROKER
        return fail(str(exc), code, type(exc).__name__, as_json=as_json)
    except KeyboardInterrupt:
        print("delayq: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
