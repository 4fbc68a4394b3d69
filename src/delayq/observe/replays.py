"""A replay of a parked message as a span: ``replay <parking queue>`` in the message's trace.

``delayq dlq replay`` and ``unrouted replay`` (:func:`delayq.sync.parking.replay`) and the
memory broker's ``replay_dlq`` / ``replay_unrouted`` take ``tracing=`` as publishers do
(see :mod:`delayq.observe.tracing`; by default on when a tracer provider is set). When
traced, each replayed message gets a span (kind ``PRODUCER``), started before its copy
is sent and ended once the broker confirmed it and the parked message was removed (with
the error, and ``error.type``, when that failed):

- its parent is the context the parked message carries (its publish's, as every attempt
  has), which it also links to (``delayq.link`` = ``parked``): the replay is in the same
  trace. A message without a valid context gets a span that is the child of the
  caller's current span, as a publish span would be;
- the caller's current span, if any, is linked too (``delayq.link`` = ``replayer``);
- its context replaces the one in the copy's headers, so the ``process`` spans of the
  attempts after the replay (and the spans of a later replay) are its children.

Attributes: ``messaging.system``, ``messaging.operation.type`` = ``send``,
``messaging.operation.name`` = ``replay``, ``messaging.destination.name`` (the exchange;
``amq.default`` for a DLQ replay, which goes to the queue alone),
``messaging.rabbitmq.destination.routing_key``, ``messaging.message.id``,
``messaging.message.body.size``, ``delayq.parked_queue``, the copy's history
(``delayq.replay_count``, ``delayq.previous_attempts``: see
:mod:`delayq.observe.carrier`) and, when delayq parked it, ``delayq.parked_reason``
and ``delayq.parked_error_type``. A tracing failure never stops a replay.
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager, nullcontext
from types import TracebackType
from typing import TYPE_CHECKING, Any

from delayq.consume.delivery import H_DEAD_LETTER_REASON, H_ERROR_TYPE, Delivery
from delayq.message.envelope import OutgoingMessage
from delayq.observe.carrier import H_PREVIOUS_ATTEMPTS, H_REPLAYS, extract, replace_context
from delayq.observe.tracing import SYSTEM, Tracing

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

__all__ = ["DEFAULT_EXCHANGE", "replaying"]

log = logging.getLogger("delayq.tracing")

DEFAULT_EXCHANGE = "amq.default"
"""How the span names the default exchange (``""``), as RabbitMQ does."""


def replaying(
    tracing: Tracing | None, parked: Delivery, copy: OutgoingMessage
) -> AbstractContextManager[None]:
    """A context around the replay of ``parked`` as ``copy``: its span started, and its
    context put in ``copy``'s headers, on entry; ended on exit, with how it went.
    Nothing while not traced (``tracing`` ``None``, or no provider set)."""
    if tracing is None:
        return nullcontext()
    try:
        tracer = tracing.tracer()
        return nullcontext() if tracer is None else _ReplaySpan(tracer, parked, copy)
    except Exception as exc:  # tracing never stops a replay
        log.warning("no replay span for %s: %r", copy.message_id, exc)
        return nullcontext()


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else ""


def _attributes(parked: Delivery, copy: OutgoingMessage) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "replay",
        "messaging.destination.name": copy.exchange or DEFAULT_EXCHANGE,
        "messaging.rabbitmq.destination.routing_key": copy.routing_key,
        "messaging.message.id": copy.message_id,
        "messaging.message.body.size": len(copy.body),
        "delayq.parked_queue": parked.queue,
        "delayq.replay_count": copy.headers.get(H_REPLAYS, 1),
        "delayq.previous_attempts": copy.headers.get(H_PREVIOUS_ATTEMPTS, parked.attempt),
    }
    reason = _text(parked.headers.get(H_DEAD_LETTER_REASON))
    if reason:
        attributes["delayq.parked_reason"] = reason
    error_type = _text(parked.headers.get(H_ERROR_TYPE))
    if error_type:
        attributes["delayq.parked_error_type"] = error_type
    return attributes


class _ReplaySpan:
    """One parked message's ``replay`` span, from before its copy is sent to its removal."""

    __slots__ = ("_span",)

    def __init__(self, tracer: Tracer, parked: Delivery, copy: OutgoingMessage) -> None:
        from opentelemetry import trace

        parent = extract(parked)
        carried = None if parent is None else trace.get_current_span(parent).get_span_context()
        current = trace.get_current_span().get_span_context()
        links: list[Any] = []
        if carried is not None and carried.is_valid:
            links.append(trace.Link(carried, {"delayq.link": "parked"}))
            if current.is_valid and current.span_id != carried.span_id:
                links.append(trace.Link(current, {"delayq.link": "replayer"}))
        else:
            parent = None  # no context of its own: the caller's current span is the parent
        self._span: Span = tracer.start_span(
            f"replay {parked.queue}",
            context=parent,
            kind=trace.SpanKind.PRODUCER,
            links=links,
            attributes=_attributes(parked, copy),
        )
        try:
            replace_context(copy.headers, trace.set_span_in_context(self._span, parent))
        except BaseException:
            self._span.end()  # the copy goes with the context it had
            raise

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        span = self._span
        if exc is not None:
            from opentelemetry.trace import Status, StatusCode

            span.set_attribute("error.type", type(exc).__name__)
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, str(exc)))
        span.end()
