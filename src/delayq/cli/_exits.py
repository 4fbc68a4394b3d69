"""The ``delayq`` command line's exit codes (see :mod:`delayq.cli`)."""

from __future__ import annotations

__all__ = ["EXIT_BROKER", "EXIT_INPUT", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_PIPE"]

EXIT_OK, EXIT_BROKER, EXIT_INPUT, EXIT_PIPE = 0, 1, 2, 141
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C ended
