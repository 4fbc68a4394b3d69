"""SIGTERM and SIGINT turned into a graceful stop while a blocking loop runs."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["stopping_on_signals"]


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
