"""Which delivery a log line is about: message id, queue, routing key and attempt on every
line logged while a consumer handles a delivery (its handler's lines included).

Both consumers bind the delivery to a context variable around its handling;
:class:`DeliveryLogFilter` copies it onto each log record, and the formatters
here print it: :class:`JsonLogFormatter` one JSON object per line,
:class:`TextLogFormatter` the usual text with ``message_id=... queue=...``
appended. ``delayq worker --log-format text|json`` sets this up; elsewhere:

>>> configure_logging("info", "json")          # doctest: +SKIP

or, on a handler of your own:

>>> handler.addFilter(DeliveryLogFilter())     # doctest: +SKIP
>>> handler.setFormatter(JsonLogFormatter())   # doctest: +SKIP

Handlers that run in a thread (sync handlers) see the same context: the
consumers copy it into the thread.

With OpenTelemetry in use (see :mod:`delayq.observe.tracing`), a line logged while a
span is recording (a delivery's ``process`` span, or the application's own) also
carries ``trace_id`` and ``span_id`` (hex, as trace backends show them), so logs and
traces join up. Nothing is imported for it: no opentelemetry, no ids.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal

from delayq.consume.delivery import Delivery
from delayq.errors import InvalidInput

__all__ = [
    "FIELDS",
    "TRACE_FIELDS",
    "DeliveryLogContext",
    "DeliveryLogFilter",
    "JsonLogFormatter",
    "LogFormat",
    "TextLogFormatter",
    "bind_delivery",
    "bound_delivery",
    "configure_logging",
    "current_delivery",
]

LogFormat = Literal["text", "json"]

FIELDS = ("message_id", "queue", "routing_key", "attempt")
"""The record attributes :class:`DeliveryLogFilter` sets (``None`` outside a delivery)."""

TRACE_FIELDS = ("trace_id", "span_id")
"""Set by :class:`DeliveryLogFilter` too while an OpenTelemetry span is current."""


def _trace_ids() -> tuple[str, str] | None:
    """The current span's ids in hex, if opentelemetry is in use and a span is current."""
    trace = sys.modules.get("opentelemetry.trace")  # not imported: no span can be current
    if trace is None:
        return None
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


@dataclass(frozen=True, slots=True)
class DeliveryLogContext:
    message_id: str | None
    queue: str
    routing_key: str
    """The routing key the message was first published with."""
    attempt: int

    @classmethod
    def of(cls, delivery: Delivery) -> DeliveryLogContext:
        return cls(
            delivery.message_id, delivery.queue, delivery.origin_routing_key, delivery.attempt
        )


# The delivery itself: its fields are read only when a line is logged, not per delivery.
_current: contextvars.ContextVar[Delivery | None] = contextvars.ContextVar(
    "delayq_delivery", default=None
)


def current_delivery() -> DeliveryLogContext | None:
    """The delivery being handled here, if any."""
    delivery = _current.get()
    return None if delivery is None else DeliveryLogContext.of(delivery)


def bind_delivery(delivery: Delivery) -> contextvars.Token[Delivery | None]:
    """:func:`bound_delivery` without a ``with`` block (the asyncio consumer's hot path):
    give the token back to ``unbind_delivery`` when done."""
    return _current.set(delivery)


unbind_delivery = _current.reset
"""Ends what :func:`bind_delivery` began (its token)."""


@contextmanager
def bound_delivery(delivery: Delivery) -> Iterator[DeliveryLogContext]:
    """Log lines within the block (and in threads started with a copy of this context)
    carry ``delivery``'s fields."""
    token = _current.set(delivery)
    try:
        yield DeliveryLogContext.of(delivery)
    finally:
        _current.reset(token)


class DeliveryLogFilter(logging.Filter):
    """Sets ``message_id``, ``queue``, ``routing_key`` and ``attempt`` on every record
    (``None`` outside a delivery), and ``trace_id`` and ``span_id`` (``None`` outside a
    span); drops nothing. Put it on a handler: a filter on a
    logger does not see its children's records."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = current_delivery()
        for name in FIELDS:
            # A record that already has the field (an extra=..., or a second filter) keeps it.
            if getattr(record, name, None) is None:
                setattr(record, name, None if context is None else getattr(context, name))
        ids = _trace_ids()
        for name, value in zip(TRACE_FIELDS, ids or (None, None), strict=True):
            if getattr(record, name, None) is None:
                setattr(record, name, value)
        return True


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {
        name: value
        for name in FIELDS + TRACE_FIELDS
        if (value := getattr(record, name, None)) is not None
    }


class TextLogFormatter(logging.Formatter):
    """``2026-01-01 12:00:00,000 INFO name: message message_id=... queue=... ...``."""

    def __init__(self, fmt: str = "%(asctime)s %(levelname)s %(name)s: %(message)s") -> None:
        super().__init__(fmt)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = _fields(record)
        if not fields:
            return text
        suffix = " ".join(f"{name}={value}" for name, value in fields.items())
        # After the message's first line, so a traceback stays below it.
        head, newline, rest = text.partition("\n")
        return f"{head} {suffix}{newline}{rest}"


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (UTC, ISO 8601), ``level``, ``logger``,
    ``message``, the delivery's fields when set, and ``exc`` with the traceback."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, tz=timezone.utc).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure_logging(level: str | int = "info", log_format: LogFormat = "text") -> logging.Handler:
    """One stderr handler on the root logger with the delivery fields, in ``log_format``;
    replaces the root's handlers. Returns the handler."""
    if log_format not in ("text", "json"):
        raise InvalidInput(f"log format must be 'text' or 'json', not {log_format!r}")
    handler = logging.StreamHandler()
    handler.addFilter(DeliveryLogFilter())
    handler.setFormatter(JsonLogFormatter() if log_format == "json" else TextLogFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    return handler
