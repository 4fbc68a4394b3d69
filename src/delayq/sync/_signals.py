"""SIGTERM and SIGINT turned into a graceful stop while a blocking loop runs."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["stopping_on_signals"]


@contextmanager
def stopping_on_signals(
    request_stop: Callable[[], None], *, install: bool = True
) -> Iterator[None]:
    """Within the block, SIGTERM and SIGINT call ``request_stop``; the handlers there
    before come back after it. ``install=False`` (not the main thread, a worker that
    handles signals itself) changes nothing."""
    previous: dict[signal.Signals, Any] = {}
    if install:
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, lambda signum, frame: request_stop())
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
