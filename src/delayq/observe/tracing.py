"""OpenTelemetry traces across the delay: a ``publish`` span per message, a ``process``
span per delivery, one trace id from the publish through every attempt to the last.

Optional: ``pip install 'delayq[otel]'`` (opentelemetry-api). Every publisher and
consumer takes ``tracing=``:

- ``None`` (the default): traced when the application uses opentelemetry (imported
  it) *and* has set a tracer provider (``opentelemetry.trace.set_tracer_provider``),
  checked at each publish and delivery; otherwise nothing happens (delayq imports
  nothing, adds no header, starts no span);
- ``True``: traced through the global provider; without opentelemetry the
  constructor raises :class:`~delayq.errors.MissingExtra` naming ``delayq[otel]``;
- a ``TracerProvider``: traced through that provider (tests: the SDK's with an
  ``InMemorySpanExporter``);
- ``False``: never traced.

The publisher starts a ``publish`` span (kind ``PRODUCER``, a child of the caller's
current span) before the send and ends it at the confirm, and injects its context
into the message's headers (W3C ``traceparent``/``tracestate``: the global
propagator's fields, str values). A message that already carries a
``traceparent`` when it is *sent* (``send``: a consumer's retry or dead letter, a
DLQ replay, or one the caller built with the header) keeps it and gets no span, so
the original context travels on unchanged: it is a user header, which retries,
dead letters and replays copy. A traced replay is a ``replay`` span of that trace, whose
context the replayed copy carries instead (:mod:`delayq.observe.replays`).

The consumer starts a ``process`` span (kind ``CONSUMER``) at each delivery and ends
it when the delivery is settled, with the outcome. Its parent is the context the
message carries (the same trace id on every attempt) and it also *links* to it, as
the messaging conventions ask (links are what batch consumers and link-aware tools
follow). The handler runs with the span current, so the application's own spans
inside it are its children. A missing or malformed ``traceparent`` (a message from
another publisher) gives a new root span with no link; the delivery is handled as
ever.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from types import TracebackType
from typing import TYPE_CHECKING, Any, Union

from delayq.consume.delivery import Delivery
from delayq.consume.flow import Ack, GiveUp, PutBack
from delayq.errors import InvalidInput, MissingExtra, PublishBatchError
from delayq.message.envelope import IMMEDIATE, OutgoingMessage
from delayq.observe.carrier import TRACEPARENT, carry_history, replay_attributes
from delayq.observe.carrier import extract as _extract
from delayq.observe.deliveries import Settled

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer, TracerProvider

__all__ = [
    "SYSTEM",
    "TRACEPARENT",
    "ProcessSpan",
    "PublishSpans",
    "StreamSpans",
    "Tracing",
    "TracingOption",
    "traced",
    "tracing_for",
]

log = logging.getLogger("delayq.tracing")

SYSTEM = "rabbitmq"
SCOPE = "delayq"
"""The instrumentation scope's name (``get_tracer(SCOPE)``)."""

TracingOption = Union[bool, "TracerProvider", None]
"""What ``tracing=`` takes (see the module's docstring)."""


def _otel() -> Any:
    """``opentelemetry.trace`` if installed, else ``None`` (imported on first use)."""
    global _TRACE
    if _TRACE is _UNLOADED:
        try:
            _TRACE = importlib.import_module("opentelemetry.trace")
        except ImportError:
            _TRACE = None
    return _TRACE


_UNLOADED: Any = object()
_TRACE: Any = _UNLOADED
_ENV_PROVIDER = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ
"""A provider named by the environment (the API loads it at its first look); read
once, at import."""


class Tracing:
    """The tracing of one publisher or consumer: which provider, and whether it is on now."""

    __slots__ = ("_failing", "_provider", "_seen", "_trace", "_tracer")

    def __init__(self, trace: Any, provider: TracerProvider | None) -> None:
        self._trace = trace
        self._provider = provider
        self._seen: object = None
        self._tracer: Tracer | None = None
        self._failing = False

    def failed(self, what: str, exc: Exception) -> None:
        """The tracing of a ``what`` raised (a span processor's, a propagator's error):
        that message goes on untraced; logged once per publisher or consumer."""
        if not self._failing:
            self._failing = True
            log.error(
                "tracing a %s failed (%r): it goes on untraced (logged once)", what, exc,
                exc_info=exc,
            )  # fmt: skip

    def tracer(self) -> Tracer | None:
        """The tracer to use now; ``None`` while no provider is set (nothing to trace)."""
        provider = self._provider
        if provider is None:
            trace = self._trace
            if trace is None:
                # Not imported by the application: no provider can have been set, and
                # delayq imports nothing on its behalf (no cost when tracing is unused).
                trace = sys.modules.get("opentelemetry.trace")
                if trace is None:
                    return None
                self._trace = trace
            # None while no provider is set (the API's own global): no call, which
            # looks up the environment each time (a web app's publish pays this).
            if getattr(trace, "_TRACER_PROVIDER", trace) is None and not _ENV_PROVIDER:
                return None
            provider = trace.get_tracer_provider()
            # The API's stand-ins until the application sets a provider: tracing off.
            if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
                return None
        if provider is not self._seen:
            self._tracer = provider.get_tracer(SCOPE)
            self._seen = provider
        return self._tracer

    def publishing(
        self, messages: Sequence[OutgoingMessage], *, keep: bool
    ) -> AbstractContextManager[None]:
        """A context around the send of ``messages``: their spans started and contexts
        injected on entry, ended with how the send went on exit (nothing while no
        provider is set). ``keep``: a message that carries a ``traceparent`` already
        keeps it (and gets no span)."""
        tracer = self.tracer()
        if tracer is None:
            return _NOTHING
        return PublishSpans(self, tracer, messages, keep)

    def streaming(self) -> StreamSpans:
        """The ``publish`` spans of a stream (``send_many``): each started as the stream
        is pulled, ended as its message settles."""
        return StreamSpans(self)

    def processing(self, delivery: Delivery, received_ms: int) -> ProcessSpan | None:
        """The ``process`` span of ``delivery`` (``None`` while no provider is set)."""
        tracer = self.tracer()
        if tracer is None:
            return None
        return ProcessSpan(self._trace, tracer, delivery, received_ms)


_NOTHING = nullcontext()


def traced(
    tracing: Tracing | None, messages: Sequence[OutgoingMessage], *, keep: bool
) -> AbstractContextManager[None]:
    """:meth:`Tracing.publishing` for a publisher's ``tracing`` (``None``: never traced)."""
    return _NOTHING if tracing is None else tracing.publishing(messages, keep=keep)


def tracing_for(option: TracingOption) -> Tracing | None:
    """Resolve a ``tracing=`` argument; ``None`` means never traced (nothing to check)."""
    if option is False:
        return None
    if option is None:
        return Tracing(None, None)  # imports nothing: looks for the application's import
    trace = _otel()
    if trace is None:
        raise MissingExtra("tracing (tracing=...)", "otel", "opentelemetry-api")
    if option is True:
        return Tracing(trace, None)
    if not callable(getattr(option, "get_tracer", None)):
        raise InvalidInput(f"tracing= takes a bool, a TracerProvider or None, not {option!r}")
    return Tracing(trace, option)


def _publish_attributes(msg: OutgoingMessage) -> dict[str, Any]:
    receipt = msg.receipt
    return {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "publish",
        "messaging.destination.name": msg.exchange,
        "messaging.rabbitmq.destination.routing_key": receipt.routing_key,
        "messaging.message.id": msg.message_id,
        "messaging.message.body.size": len(msg.body),
        "delayq.delay_ms": receipt.delay_ms,
        "delayq.tier": receipt.tier or IMMEDIATE,
        "delayq.tier_ms": receipt.tier_ms,
        "delayq.strategy": receipt.strategy.value,
        "delayq.due_at_ms": receipt.published_at_ms + receipt.tier_ms,
    }


class PublishSpans:
    """The ``publish`` spans of one send (one message, or a batch: a span each)."""

    __slots__ = ("_keep", "_messages", "_spans", "_tracer", "_tracing")

    def __init__(
        self, tracing: Tracing, tracer: Tracer, messages: Sequence[OutgoingMessage], keep: bool
    ) -> None:
        self._tracing = tracing
        self._tracer = tracer
        self._messages = messages
        self._keep = keep
        self._spans: list[Span | None] = []

    def __enter__(self) -> None:
        tracer = self._tracer
        trace = self._tracing._trace
        from opentelemetry import propagate

        kind = trace.SpanKind.PRODUCER
        for msg in self._messages:
            if self._keep and TRACEPARENT in msg.headers:
                self._spans.append(None)
                continue
            headers = msg.headers
            before = set(headers)
            span = None
            try:
                span = tracer.start_span(
                    f"publish {msg.exchange}", kind=kind, attributes=_publish_attributes(msg)
                )
                # The message's own headers dict (built for this send): its context goes along.
                propagate.inject(headers, context=trace.set_span_in_context(span))
            except Exception as exc:  # a processor's or propagator's: never the publish's
                for added in set(headers) - before:
                    del headers[added]  # no half-written context
                self._tracing.failed("publish", exc)
                _end_quietly(span)
                span = None
            self._spans.append(span)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self._spans:
            return
        status = self._tracing._trace.Status
        error_code = self._tracing._trace.StatusCode.ERROR
        for index, span in enumerate(self._spans):
            if span is None:
                continue
            error = exc
            if isinstance(exc, PublishBatchError):
                error = exc.failures.get(index)
            try:
                if error is not None:
                    span.set_attribute("error.type", type(error).__name__)
                    span.record_exception(error)
                    span.set_status(status(error_code, str(error)))
                span.end()
            except Exception as exc:  # a processor's: never the publish's
                self._tracing.failed("publish", exc)


def _end_quietly(span: Span | None) -> None:
    if span is not None:
        with contextlib.suppress(Exception):
            span.end()


class StreamSpans:
    """A span per message of a stream, by its index in the stream (as ``settle`` gets it)."""

    __slots__ = ("_open", "_tracing")

    def __init__(self, tracing: Tracing) -> None:
        self._tracing = tracing
        self._open: dict[int, PublishSpans] = {}

    def pulled(self, messages: Iterable[OutgoingMessage]) -> Iterator[OutgoingMessage]:
        """``messages``, each with its span started (and context injected) as it is pulled."""
        for index, msg in enumerate(messages):
            spans = self._tracing.publishing([msg], keep=True)
            spans.__enter__()
            if isinstance(spans, PublishSpans):
                self._open[index] = spans
            yield msg

    def settled(self, index: int, error: BaseException | None) -> None:
        """Message ``index`` settled: confirmed (``error`` ``None``) or not."""
        spans = self._open.pop(index, None)
        if spans is not None:
            spans.__exit__(None if error is None else type(error), error, None)

    def close(self, error: BaseException | None) -> None:
        """The stream ended (``error``: how, if it failed): end the spans still open."""
        for index in list(self._open):
            self.settled(index, error)


class ProcessSpan:
    """One delivery's ``process`` span, from its arrival to its settlement."""

    __slots__ = ("_delivery", "_ended", "_received_ms", "_token", "_trace", "span")

    def __init__(self, trace: Any, tracer: Tracer, delivery: Delivery, received_ms: int) -> None:
        self._trace = trace
        self._delivery = delivery
        self._received_ms = received_ms
        self._token: object = None
        self._ended = False
        parent = _extract(delivery)
        carried = None if parent is None else trace.get_current_span(parent).get_span_context()
        links: list[Any] = []
        if carried is not None and carried.is_valid:
            links.append(trace.Link(carried, {"delayq.link": "publish"}))
        else:
            parent = None  # a malformed context: a new root, not a child of nothing
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": delivery.queue,
            "messaging.rabbitmq.destination.routing_key": delivery.origin_routing_key,
            "messaging.message.body.size": len(delivery.body),
            "delayq.attempt": delivery.attempt,
            **replay_attributes(delivery.headers),  # attempts before a DLQ replay
        }
        if delivery.message_id is not None:
            attributes["messaging.message.id"] = delivery.message_id
        self.span: Span = tracer.start_span(
            f"process {delivery.queue}",
            context=parent,
            kind=trace.SpanKind.CONSUMER,
            links=links,
            attributes=attributes,
        )

    def attach(self) -> None:
        """Make the span current here (the handler's children hang under it)."""
        from opentelemetry import context

        self._token = context.attach(self._trace.set_span_in_context(self.span))

    def detach(self) -> None:
        if self._token is not None:
            from opentelemetry import context

            context.detach(self._token)  # type: ignore[arg-type]
            self._token = None

    def failed(self, error: BaseException) -> None:
        """The handler raised ``error`` (the outcome, retry or dead letter, comes later)."""
        self.span.record_exception(error)
        self.span.set_attribute("error.type", type(error).__name__)
        self.span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, str(error)))

    def carry(self, message: OutgoingMessage) -> None:
        """A retry or dead letter of a delivery that came without a context continues
        this span's trace (one that came with a context carries that one on); it also
        carries the delivery's replay history on (see :mod:`delayq.observe.carrier`)."""
        carry_history(self._delivery.headers, message.headers)
        if TRACEPARENT not in message.headers:
            from opentelemetry import propagate

            propagate.inject(message.headers, context=self._trace.set_span_in_context(self.span))

    def finish(self, settlement: Ack | PutBack | GiveUp, now_ms: int) -> None:
        """End the span with how the delivery was settled (once; later calls do nothing)."""
        if self._ended:
            return
        self._ended = True
        span = self.span
        if isinstance(settlement, Ack):
            decision, handler_ms = settlement.decision, settlement.handler_ms
            event = Settled(self._delivery, decision, self._received_ms, now_ms, handler_ms)
            span.set_attributes(_settled_attributes(event))
        elif isinstance(settlement, PutBack):
            span.set_attributes({"delayq.outcome": "returned", "delayq.reason": settlement.why})
        else:
            span.set_attribute("delayq.outcome", "stopped")
        span.end()

    def abandon(self, why: str) -> None:
        """End the span of a delivery left unsettled (its channel lost, its task cancelled)."""
        self.finish(PutBack(why), 0)


def _settled_attributes(event: Settled) -> dict[str, Any]:
    attributes: dict[str, Any] = {"delayq.outcome": event.outcome}
    optional: Iterable[tuple[str, Any]] = (
        ("delayq.reason", event.reason or None),
        ("delayq.tier", event.tier),
        ("delayq.due_at_ms", event.due_at_ms),
        ("delayq.lateness_ms", event.lateness_ms),
        ("delayq.handler_ms", event.handler_ms),
        ("delayq.retry_delay_ms", event.retry_delay_ms),
    )
    attributes.update((name, value) for name, value in optional if value is not None)
    return attributes
