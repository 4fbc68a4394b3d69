"""The ``delayq`` command line.

Exit codes: 0 success; 1 the broker refused or could not be reached, the
topology conflicts with what exists, a check of ``topology verify`` failed, or
``migrate plan`` left a binding out of the plan it wrote;
2 bad input (nothing was sent); 130 interrupted (Ctrl-C); 141 the reader of the
output went away (``delayq dlq list | head``), like a command killed by SIGPIPE. A
``--json`` command that fails prints one JSON error object on stdout (see
:func:`delayq.cli._common.fail`).

This module imports nothing at its top (the exit codes load on first use): :func:`main`
loads the command tree (click, the commands' options) and each command what it runs, so
``delayq --help`` starts in a fraction of what ``import delayq.sync`` costs, and a
Ctrl-C that lands while the command line is still loading ends it like any other
(one line, exit 130), not with a traceback.
"""

# No ``from __future__ import annotations`` and no import but sys (loaded before any
# script runs): what this module and delayq/__init__.py import runs before main() can
# catch a Ctrl-C, so they import nothing, and the annotations naming what is imported
# for type checkers alone are strings.
import sys

TYPE_CHECKING = False  # no typing import for it: see delayq/__init__.py
if TYPE_CHECKING:
    from collections.abc import Sequence

    import click

    from delayq.cli._exits import EXIT_BROKER, EXIT_INPUT, EXIT_INTERRUPTED, EXIT_OK, EXIT_PIPE
    from delayq.cli.options import Invocation

__all__ = [
    "EXIT_BROKER",
    "EXIT_INPUT",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_PIPE",
    "build_cli",
    "main",
    "parse",
]


def main(argv: "Sequence[str] | None" = None) -> int:
    """Run ``delayq ARGV`` (default: ``sys.argv[1:]``); returns the exit code."""
    try:
        from delayq.cli._main import run
        from delayq.cli._process import set_ends_process

        set_ends_process(argv is None)
        return run(argv)
    except KeyboardInterrupt:  # while loading, or anywhere a command did not catch it
        print("delayq: interrupted", file=sys.stderr)
        return 130  # EXIT_INTERRUPTED; an import here could be interrupted in turn


def build_cli() -> "click.Group":
    """The whole command tree, built fresh (see :func:`delayq.cli.app.build_cli`)."""
    from delayq.cli.app import build_cli

    return build_cli()


def parse(argv: "Sequence[str]") -> "Invocation | int":
    """What ``delayq ARGV`` would run (see :func:`delayq.cli.app.parse`)."""
    from delayq.cli.app import parse

    return parse(argv)


def __getattr__(name: str) -> int:
    """The exit codes (``EXIT_OK`` ...), from :mod:`delayq.cli._exits` on first use."""
    import importlib  # not `from delayq.cli import _exits`: that asks this function

    _exits = importlib.import_module("delayq.cli._exits")
    if name in _exits.__all__:
        value: int = getattr(_exits, name)
        return value
    raise AttributeError(f"module 'delayq.cli' has no attribute {name!r}")
