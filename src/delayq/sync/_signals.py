"""SIGTERM and SIGINT turned into a graceful stop while a blocking loop runs."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["stopping_on_signals", "wait_for_stop"]


@contextmanager
def stopping_on_signals(
    request_stop: Callable[[], None],
    *,
    install: bool = True,
    signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT),
) -> Iterator[None]:
    """Within the block, ``signals`` (SIGTERM and SIGINT) call ``request_stop``; the
    handlers there before come back after it. ``install=False`` (a worker that handles
    signals itself) changes nothing, and neither does a thread other than the main one:
    only that one may install handlers, so there a stop comes from ``request_stop``
    alone."""
    previous: dict[signal.Signals, Any] = {}
    if install and threading.current_thread() is threading.main_thread():
        for sig in signals:
            previous[sig] = signal.signal(sig, lambda signum, frame: request_stop())
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


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
