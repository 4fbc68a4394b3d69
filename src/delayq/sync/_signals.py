"""SIGTERM and SIGINT turned into a graceful stop while a blocking loop runs."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["ignore_late_signals", "stopping_on_signals", "wait_for_stop"]


@contextmanager
def stopping_on_signals(
    request_stop: Callable[[], None],
    *,
    install: bool = True,
    signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT),
    last: bool = False,
) -> Iterator[None]:
    """Within the block, ``signals`` (SIGTERM and SIGINT) call ``request_stop``; the
    handlers there before come back after it. ``install=False`` (a worker that handles
    signals itself) changes nothing, and neither does a thread other than the main one:
    only that one may install handlers, so there a stop comes from ``request_stop``
    alone. ``last``: the process ends after the block (a command's run), so ``signals``
    are ignored from then on instead: their default would end it by that signal, after
    it stopped as asked (a second SIGTERM 20 ms late: killed, not exit 0)."""
    previous: dict[signal.Signals, Any] = {}
    if install and threading.current_thread() is threading.main_thread():
        for sig in signals:
            previous[sig] = signal.signal(sig, lambda signum, frame: request_stop())
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_IGN if last else handler)


SIGNAL_CHECK_S = 0.25
"""How often a main thread waiting for a stop wakes, to let Python run a signal's handler."""


def wait_for_stop(stop: threading.Event) -> None:
    """Wait for ``stop`` in the main thread so that SIGTERM or SIGINT still set it: CPython
    runs signal handlers in the main thread only, and a signal the kernel hands to another
    thread (it does, to one not already holding a signal: SIGHUP then SIGTERM within
    moments) does not wake a main thread blocked on a lock; without a timeout that wait
    never ends."""
    while not stop.wait(SIGNAL_CHECK_S):
        pass


def ignore_late_signals() -> None:
    """A command's long run is over and the process ends: SIGTERM, SIGINT and SIGHUP
    change nothing from here on (their defaults would end it by that signal, after it
    stopped as asked: a second Ctrl-C a moment late, not the command's exit code)."""
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT, getattr(signal, "SIGHUP", None)):
            if sig is not None:
                signal.signal(sig, signal.SIG_IGN)
