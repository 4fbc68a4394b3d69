"""Whether a command runs as the ``delayq`` program itself, which ends with it."""

from __future__ import annotations

__all__ = ["ends_process", "set_ends_process"]

_ENDS_PROCESS = False


def set_ends_process(ends: bool) -> None:
    global _ENDS_PROCESS
    _ENDS_PROCESS = ends


def ends_process() -> bool:
    """Whether this run is the process's own (the ``delayq`` program: :func:`delayq.cli.main`
    given no ``argv``), which ends with the command: a long-running command then ignores
    a late signal rather than put back the handlers it found (a caller's, in a process
    that goes on)."""
    return _ENDS_PROCESS
