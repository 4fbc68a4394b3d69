"""OpenTelemetry tracing of a Spark scheduling job: one span for the job on the driver,
and each message's ``publish`` span, started by the task that sends it, its child.

The tasks run in Spark's Python workers (other processes, on a cluster other
machines), where the application's tracer provider does not exist. So
``tracing=`` of :func:`delayq.spark.schedule` takes a *provider factory*: a function
of no argument returning a ``TracerProvider``, which Spark pickles into the tasks
(cloudpickle, like any function of the job) and each Python worker calls once, on its
first traced task, keeping the provider for the later ones (Spark reuses its workers).
The factory sets up the exporter, so spans leave the executors by themselves (OTLP to
a collector, typically).

On the driver the job's span (``schedule <namespace>``; one per micro-batch of a
stream) is started through the application's global provider when it set one (a child
of its current span), else through the factory's. Its context travels to the tasks
as a small dict (W3C ``traceparent``/``tracestate``, whatever the propagators
configured on either side) and each task makes it current around its sends: every
``publish`` span is the job span's child, and each message's ``process`` spans carry
the same trace on.

Tracing never fails a job: a factory that raises (or returns no provider, or
opentelemetry missing on the executors) leaves that worker's tasks publishing
untraced; each such task says so in its results, and the driver logs it once per job.
A task flushes its provider before it ends (a worker ends with ``os._exit``, which runs
no exit hook that would export what a batch processor still holds).
"""

from __future__ import annotations

import hashlib
import logging
import pickle
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from delayq.errors import InvalidInput, MissingExtra
from delayq.observe.tracing import SCOPE, SYSTEM, Tracing, _otel

if TYPE_CHECKING:
    from opentelemetry.trace import Span, TracerProvider

__all__ = [
    "UNTRACED",
    "JobSpan",
    "JobTracing",
    "ProviderFactory",
    "TaskTracing",
    "job_span",
    "report_untraced",
]

log = logging.getLogger("delayq.tracing")

ProviderFactory = Callable[[], "TracerProvider"]
"""What ``tracing=`` of a Spark job takes: a function building a ``TracerProvider``."""

UNTRACED = "untraced"
"""The result kind of a task that published without spans (``error``: why)."""

FLUSH_MS = 10_000
"""How long a task waits for its spans to be exported before it ends."""

_PROVIDERS: dict[str, tuple[Any, str | None]] = {}
"""This process's providers by factory key: ``(provider, None)`` or ``(None, why not)``."""


def _pickled(factory: ProviderFactory) -> tuple[bytes, str]:
    """The factory pickled as Spark pickles a task, and its identity across processes:
    a digest of that (the same function gives the same key on every worker; another, or
    the same closing over other values, another), so a reused worker never serves one
    job another's provider. The tasks get the bytes and unpickle them themselves: a
    factory they cannot load (its module missing there) leaves them untraced, not failed."""
    from pyspark import cloudpickle

    dumps: Any = cloudpickle.dumps  # as Spark pickles the task that carries it
    try:
        data = dumps(factory)
    except Exception as exc:
        raise InvalidInput(
            f"tracing: the provider factory cannot be sent to the executors "
            f"({type(exc).__name__}: {exc}); build the TracerProvider inside the function, "
            "do not close over one built here"
        ) from exc
    return data, hashlib.sha256(data).hexdigest()[:20]


@dataclass(frozen=True)
class JobTracing:
    """A job's ``tracing=``, checked on the driver: the factory, pickled, and its key."""

    factory: ProviderFactory
    pickled: bytes
    key: str

    @classmethod
    def of(cls, option: object) -> JobTracing | None:
        """``None``/``False``: no tracing; a provider factory; anything else is refused
        (:class:`~delayq.errors.InvalidInput`), and without opentelemetry the factory
        is refused with :class:`~delayq.errors.MissingExtra` (``delayq[otel]``)."""
        if option is None or option is False:
            return None
        provider = not isinstance(option, type) and callable(getattr(option, "get_tracer", None))
        if option is True or provider:
            raise InvalidInput(
                f"tracing={option!r} cannot trace the Spark tasks: no tracer provider exists "
                "in Spark's Python workers, and a provider built here does not travel there "
                "(its exporter's threads and sockets do not pickle). Pass a function that "
                "builds one: tracing=make_provider (docs/guides/spark.md, Tracing)"
            )
        if not callable(option):
            raise InvalidInput(
                "tracing= takes a function returning a TracerProvider (called once in each "
                f"Spark Python worker), or None; not {option!r}"
            )
        if _otel() is None:
            raise MissingExtra("tracing (tracing=...)", "otel", "opentelemetry-api")
        return cls(option, *_pickled(option))

    def task(self, parent: Mapping[str, str]) -> TaskTracing:
        """What the tasks get: the factory, and the job span's context (``parent``)."""
        return TaskTracing(self.pickled, self.key, dict(parent))


def _provider(key: str, load: Callable[[], ProviderFactory]) -> tuple[Any, str | None]:
    """The provider of the factory ``load()`` gives, in this process (built on first
    use), or ``None`` and why; a failure is kept too, so it is met (and logged) once
    per process."""
    found = _PROVIDERS.get(key)
    if found is None:
        try:
            if _otel() is None:
                raise MissingExtra("tracing (tracing=...)", "otel", "opentelemetry-api")
            provider = load()()
            if not callable(getattr(provider, "get_tracer", None)):
                raise TypeError(f"the provider factory returned {provider!r}, no TracerProvider")
            found = (provider, None)
        except Exception as exc:  # tracing never fails a publish
            log.warning("tracing: the provider factory failed, publishing untraced", exc_info=True)
            found = (None, f"{type(exc).__name__}: {exc}")
        _PROVIDERS[key] = found
    return found


def _flush(provider: Any) -> None:
    flush = getattr(provider, "force_flush", None)  # the SDK's; the API has none
    if flush is not None:
        try:
            flush(FLUSH_MS)
        except Exception:
            log.warning("tracing: exporting the task's spans failed", exc_info=True)


@dataclass(frozen=True)
class TaskTracing:
    """What a task needs to trace its sends (pickled into the task's closure)."""

    pickled: bytes
    """The provider factory (cloudpickle's)."""
    key: str
    parent: dict[str, str]
    """The job span's context (W3C fields; empty: the publish spans are roots)."""

    def provider(self) -> tuple[TracerProvider | None, str | None]:
        """This worker's provider (``None`` and why, when its factory failed)."""
        provider, why = _provider(self.key, lambda: pickle.loads(self.pickled))
        return provider, why

    @contextmanager
    def sending(self, provider: TracerProvider | None) -> Iterator[None]:
        """The job span's context current around the sends (so each ``publish`` span is
        its child); the provider's spans flushed at the end."""
        if provider is None:
            yield
            return
        from opentelemetry import context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        token = context.attach(TraceContextTextMapPropagator().extract(self.parent))
        try:
            yield
        finally:
            context.detach(token)
            _flush(provider)


def report_untraced(counts: Mapping[tuple[Any, ...], int]) -> None:
    """Log once what the tasks said of their tracing (``counts``: the job's tally)."""
    why = {key[2]: n for key, n in counts.items() if key[0] == UNTRACED}
    if why:
        tasks = sum(why.values())
        log.warning(
            "tracing: %d task(s) published untraced (no publish spans, no traceparent): "
            "the provider factory failed on the executors: %s",
            tasks,
            "; ".join(sorted(why)),
        )


class JobSpan:
    """The driver's span of one run (a job, a micro-batch), current while it runs."""

    def __init__(self, span: Span | None, trace: Any) -> None:
        self.span = span
        self._trace = trace
        self.carrier: dict[str, str] = {}
        if span is not None:
            from opentelemetry.trace.propagation.tracecontext import (
                TraceContextTextMapPropagator,
            )

            context = trace.set_span_in_context(span)
            TraceContextTextMapPropagator().inject(self.carrier, context=context)

    def set(self, attributes: Mapping[str, Any]) -> None:
        if self.span is not None:
            self.span.set_attributes(dict(attributes))

    def summary(self, summary: Any) -> None:
        """The run's figures as attributes (a :class:`~delayq.spark.ScheduleSummary`)."""
        self.set(
            {
                "delayq.published": summary.total_published,
                "delayq.rejected": summary.total_rejected,
                "delayq.unconfirmed": summary.total_unconfirmed,
                "delayq.retried": summary.retried,
            }
        )


@contextmanager
def job_span(
    tracing: JobTracing | None, namespace: str, attributes: Mapping[str, Any]
) -> Iterator[JobSpan | None]:
    """The span of a run (``schedule <namespace>``), ended with how it went; ``None``
    without ``tracing``. A failure to start it leaves the job untraced, never failed."""
    if tracing is None:
        yield None
        return
    trace = _otel()
    tracer = Tracing(trace, None).tracer()  # the application's global provider, if set
    own = None
    if tracer is None:
        own, _ = _provider(tracing.key, lambda: tracing.factory)
        tracer = None if own is None else own.get_tracer(SCOPE)
    if tracer is None:
        yield JobSpan(None, trace)
        return
    span = tracer.start_span(
        f"schedule {namespace}",
        kind=trace.SpanKind.INTERNAL,
        attributes={"messaging.system": SYSTEM, "delayq.namespace": namespace, **attributes},
    )
    from opentelemetry import context

    token = context.attach(trace.set_span_in_context(span))
    try:
        yield JobSpan(span, trace)
    except BaseException as exc:
        span.set_attribute("error.type", type(exc).__name__)
        span.record_exception(exc)
        span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)))
        raise
    finally:
        context.detach(token)
        span.end()
        if own is not None:
            _flush(own)
