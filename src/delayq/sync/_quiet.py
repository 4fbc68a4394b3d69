"""pika's log records of what delayq expects: a passive declare's ``404`` (a probe for an
entity that may be missing) and the channel opened again after it. Silenced only on the
thread running such a probe, while it runs; every other record of pika's goes through."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

__all__ = ["expected_closes"]

_LOGGERS = ("pika.channel", "pika.adapters.blocking_connection")
_state = threading.local()


class _Expected(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(_state, "probing", 0):
            return True
        text = str(record.msg)
        if text.startswith("Created channel"):
            return False
        args = record.args if isinstance(record.args, tuple) else ()
        return not (text.startswith("Received remote Channel.Close") and args[:1] == (404,))


_EXPECTED = _Expected()
for _name in _LOGGERS:  # once, at import: it lets every record through but a probe's
    logging.getLogger(_name).addFilter(_EXPECTED)


@contextlib.contextmanager
def expected_closes() -> Iterator[None]:
    """Within: pika's records of a ``404`` channel close and of a channel opened, on this
    thread, are dropped (delayq reports a missing entity in its own words, if at all)."""
    _state.probing = getattr(_state, "probing", 0) + 1
    try:
        yield
    finally:
        _state.probing -= 1
