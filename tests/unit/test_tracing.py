"""OpenTelemetry spans across the delay, on the memory broker (delayq.observe.tracing)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from delayq import Topology, Worker
from delayq.consume.retry import FixedBackoff
from delayq.errors import InvalidInput, MissingExtra
from delayq.message.envelope import Message
from delayq.observe import tracing as tracing_module
from delayq.observe.logs import DeliveryLogFilter, JsonLogFormatter
from delayq.stores.memory import InMemoryStore
from delayq.testing import MemoryBroker

TOPOLOGY = Topology(
    namespace="shop",
    ladder=["1m", "5m"],
    destinations=[{"queue": "emails", "bindings": ["email.*"]}],
)
RETRY = FixedBackoff(delay="1m", max_attempts=2)


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def _named(exporter: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def _fails_once(calls: list[int]) -> Any:
    def handle(body: Any) -> None:
        calls.append(len(calls) + 1)
        if len(calls) == 1:
            raise ConnectionError("smtp down")

    return handle


def test_one_trace_from_publish_through_a_retry_to_the_ack(
    memory_broker: MemoryBroker, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    memory_broker.apply(TOPOLOGY)
    calls: list[int] = []
    memory_broker.consumer(TOPOLOGY, "emails", _fails_once(calls), policy=RETRY, tracing=provider)
    publisher = memory_broker.publisher(TOPOLOGY, tracing=provider)
    receipt = publisher.publish({"to": "a@b.c"}, "email.welcome", "50s")

    [waiting] = memory_broker.messages("shop.tier.1m")
    assert waiting.headers["traceparent"].startswith("00-")
    memory_broker.advance("3m")
    assert calls == [1, 2]

    [publish] = _named(exporter, "publish")
    first, second = _named(exporter, "process")
    assert publish.kind is SpanKind.PRODUCER and first.kind is SpanKind.CONSUMER
    assert publish.name == f"publish {receipt.exchange}" and first.name == "process emails"
    trace_id = publish.context.trace_id
    assert {s.context.trace_id for s in (first, second)} == {trace_id}
    for process in (first, second):
        assert process.parent is not None and process.parent.span_id == publish.context.span_id
        [link] = process.links
        assert link.context.span_id == publish.context.span_id
    assert waiting.headers["traceparent"].split("-")[2] == f"{publish.context.span_id:016x}"

    sent = _attrs(publish)
    assert sent["messaging.system"] == "rabbitmq"
    assert sent["messaging.operation.type"] == "send"
    assert sent["messaging.destination.name"] == receipt.exchange
    assert sent["messaging.rabbitmq.destination.routing_key"] == "email.welcome"
    assert sent["messaging.message.id"] == receipt.message_id
    assert (sent["delayq.delay_ms"], sent["delayq.tier"], sent["delayq.tier_ms"]) == (
        50_000,
        "1m",
        60_000,
    )
    assert sent["delayq.strategy"] == "tiered"
    assert sent["delayq.due_at_ms"] == receipt.published_at_ms + 60_000

    one, two = _attrs(first), _attrs(second)
    assert (one["delayq.attempt"], one["delayq.outcome"]) == (1, "retry")
    assert (two["delayq.attempt"], two["delayq.outcome"]) == (2, "ack")
    assert one["delayq.retry_delay_ms"] == 60_000 and one["error.type"] == "ConnectionError"
    assert first.status.status_code is StatusCode.ERROR
    assert second.status.status_code is StatusCode.UNSET
    assert one["delayq.lateness_ms"] == 0 and one["delayq.tier"] == "1m"
    assert "delayq.handler_ms" in one and "delayq.handler_ms" in two
    assert one["messaging.operation.type"] == "process"
    assert one["messaging.message.id"] == receipt.message_id


def test_send_many_traces_each_message_of_the_stream_as_it_settles(
    memory_broker: MemoryBroker, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    memory_broker.apply(TOPOLOGY)
    memory_broker.delete_queue("shop.tier.5m")  # the second message is returned: unroutable
    publisher = memory_broker.publisher(TOPOLOGY, tracing=provider)
    built = [publisher.factory.build(b"x", "email.x", delay) for delay in ("1m", "5m", "1m")]
    settled: list[tuple[int, bool]] = []
    publisher.send_many(iter(built), settle=lambda i, m, e: settled.append((i, e is None)))
    assert settled == [(0, True), (1, False), (2, True)]
    published = _named(exporter, "publish")
    assert len(published) == 3 and all("traceparent" in m.headers for m in built)
    by_id = {_attrs(s)["messaging.message.id"]: s for s in published}
    failed = by_id[built[1].message_id]
    assert failed.status.status_code is StatusCode.ERROR
    assert _attrs(failed)["error.type"] == "Unroutable"
    assert by_id[built[0].message_id].status.status_code is StatusCode.UNSET


def test_a_duplicate_is_a_process_span_with_its_outcome(
    memory_broker: MemoryBroker, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    memory_broker.apply(TOPOLOGY)
    memory_broker.consumer(
        TOPOLOGY, "emails", lambda body: None, store=InMemoryStore(), tracing=provider
    )
    publisher = memory_broker.publisher(TOPOLOGY, tracing=provider)
    for _ in range(2):
        publisher.publish("once", "email.x", "0s", message_id="m-1")
    memory_broker.advance("1s")
    first, second = _named(exporter, "process")
    assert (_attrs(first)["delayq.outcome"], _attrs(second)["delayq.outcome"]) == (
        "ack",
        "duplicate",
    )
    assert "delayq.handler_ms" not in _attrs(second)  # its handler did not run


def test_the_handlers_own_spans_are_children_of_the_process_span(
    memory_broker: MemoryBroker, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    memory_broker.apply(TOPOLOGY)
    tracer = provider.get_tracer("app")

    def handle(body: Any) -> None:
        with tracer.start_as_current_span("send-mail"):
            pass

    memory_broker.consumer(TOPOLOGY, "emails", handle, tracing=provider)
    memory_broker.publisher(TOPOLOGY, tracing=provider).publish("hi", "email.x", "0s")
    memory_broker.advance("1s")
    [mine] = _named(exporter, "send-mail")
    [process] = _named(exporter, "process")
    assert mine.parent is not None and mine.parent.span_id == process.context.span_id


def test_log_lines_in_a_traced_delivery_carry_its_trace_and_span_ids(
    memory_broker: MemoryBroker, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(DeliveryLogFilter())
    handler.setFormatter(JsonLogFormatter())
    logger = logging.getLogger("test.tracing.logs")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        memory_broker.apply(TOPOLOGY)
        memory_broker.consumer(
            TOPOLOGY, "emails", lambda body: logger.info("handling"), tracing=provider
        )
        memory_broker.publisher(TOPOLOGY, tracing=provider).publish("hi", "email.x", "0s")
        memory_broker.advance("1s")
        logger.info("outside")
    finally:
        logger.removeHandler(handler)
    inside, outside = (json.loads(line) for line in out.getvalue().splitlines())
    [process] = _named(exporter, "process")
    assert inside["trace_id"] == f"{process.context.trace_id:032x}"
    assert inside["span_id"] == f"{process.context.span_id:016x}"
    assert inside["message_id"] is not None
    assert "trace_id" not in outside and "span_id" not in outside


@pytest.mark.parametrize("kind", ["coroutine", "plain"])
def test_async_consumers_run_either_handler_in_the_process_span(
    memory_broker: MemoryBroker, spans: tuple[TracerProvider, InMemorySpanExporter], kind: str
) -> None:
    provider, exporter = spans
    memory_broker.apply(TOPOLOGY)
    tracer = provider.get_tracer("app")

    def plain(body: Any) -> None:
        with tracer.start_as_current_span("mine"):
            pass

    async def coroutine(body: Any) -> None:
        plain(body)

    async def main() -> None:
        handler = coroutine if kind == "coroutine" else plain
        await memory_broker.async_consumer(TOPOLOGY, "emails", handler, tracing=provider)
        publisher = memory_broker.async_publisher(TOPOLOGY, tracing=provider)
        await publisher.publish("hi", "email.x", "0s")
        await memory_broker.advance_async("1s")

    asyncio.run(main())
    [mine] = _named(exporter, "mine")
    [process] = _named(exporter, "process")
    assert mine.parent is not None and mine.parent.span_id == process.context.span_id


def test_a_dead_letter_replayed_from_the_dlq_stays_in_the_original_trace(
    memory_broker: MemoryBroker, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    memory_broker.apply(TOPOLOGY)
    fail = [True]

    def handle(body: Any) -> None:
        if fail[0]:
            raise ValueError("bad address")

    policy = FixedBackoff(delay="1m", max_attempts=1)
    memory_broker.consumer(TOPOLOGY, "emails", handle, policy=policy, tracing=provider)
    memory_broker.publisher(TOPOLOGY, tracing=provider).publish("hi", "email.x", "0s")
    memory_broker.advance("1s")
    [parked] = memory_broker.dlq("emails")
    fail[0] = False
    assert len(memory_broker.replay_dlq("emails")) == 1
    memory_broker.advance("1s")

    [publish] = _named(exporter, "publish")
    dead, replayed = _named(exporter, "process")
    assert _attrs(dead)["delayq.outcome"] == "dead-letter"
    assert _attrs(dead)["delayq.reason"].startswith("exhausted")
    assert _attrs(replayed)["delayq.outcome"] == "ack"
    assert parked.headers["traceparent"].split("-")[1] == f"{publish.context.trace_id:032x}"
    assert {dead.context.trace_id, replayed.context.trace_id} == {publish.context.trace_id}
    assert replayed.links[0].context.span_id == publish.context.span_id


def test_async_publish_many_traces_each_message_and_async_consumers_link_them(
    memory_broker: MemoryBroker, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    memory_broker.apply(TOPOLOGY)
    got: list[str] = []
    calls: list[int] = []
    fails_once = _fails_once(calls)

    async def handle(body: str) -> None:
        if body == "b":
            fails_once(body)
        got.append(body)

    async def main() -> None:
        await memory_broker.async_consumer(
            TOPOLOGY, "emails", handle, policy=RETRY, tracing=provider
        )
        publisher = memory_broker.async_publisher(TOPOLOGY, tracing=provider)
        await publisher.publish_many([Message(b, "email.x", "0s") for b in ("a", "b")])
        await memory_broker.advance_async("2m")

    asyncio.run(main())
    assert sorted(got) == ["a", "b"]
    publishes = _named(exporter, "publish")
    processes = _named(exporter, "process")
    assert len(publishes) == 2 and len(processes) == 3
    assert len({p.context.trace_id for p in publishes}) == 2  # a trace per message
    by_trace = {p.context.trace_id: p for p in publishes}
    for process in processes:
        origin = by_trace[process.context.trace_id]
        assert process.links[0].context.span_id == origin.context.span_id
    outcomes = sorted(_attrs(p)["delayq.outcome"] for p in processes)
    assert outcomes == ["ack", "ack", "retry"]


def test_a_worker_passes_tracing_to_its_consumers(
    memory_broker: MemoryBroker, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    memory_broker.apply(TOPOLOGY)
    worker = Worker(TOPOLOGY, tracing=provider)
    worker.handler("emails")(lambda body: None)
    memory_broker.attach(worker)
    memory_broker.publisher(TOPOLOGY, tracing=provider).publish("hi", "email.x", "0s")
    memory_broker.advance("1s")
    [publish] = _named(exporter, "publish")
    [process] = _named(exporter, "process")
    assert process.context.trace_id == publish.context.trace_id


def test_without_a_provider_nothing_is_traced_and_no_header_is_added(
    memory_broker: MemoryBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The API's stand-in provider (what an application that set none has).
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    memory_broker.apply(TOPOLOGY)
    memory_broker.publisher(TOPOLOGY).publish("hi", "email.x", "1m")
    [waiting] = memory_broker.messages("shop.tier.1m")
    assert "traceparent" not in waiting.headers


def test_the_global_provider_is_used_once_set(
    memory_broker: MemoryBroker,
    spans: tuple[TracerProvider, InMemorySpanExporter],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    provider, exporter = spans
    memory_broker.apply(TOPOLOGY)
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    publisher = memory_broker.publisher(TOPOLOGY)  # built before the provider is set
    memory_broker.consumer(TOPOLOGY, "emails", lambda body: None)
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    publisher.publish("hi", "email.x", "0s")
    memory_broker.advance("1s")
    assert len(_named(exporter, "publish")) == 1 and len(_named(exporter, "process")) == 1


def test_a_provider_the_environment_names_is_used(
    memory_broker: MemoryBroker,
    spans: tuple[TracerProvider, InMemorySpanExporter],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No provider set in code, one named by ``OTEL_PYTHON_TRACER_PROVIDER``: the API
    loads it at its first look, which a publish makes only while that variable is set
    (read once: without it, a publish does not look the environment up each time)."""
    import delayq.observe.tracing as tracing

    provider, exporter = spans
    memory_broker.apply(TOPOLOGY)
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    publisher = memory_broker.publisher(TOPOLOGY)
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)  # the env's, loaded
    publisher.publish("hi", "email.x", "0s")
    assert _named(exporter, "publish") == []  # no variable: the API is not asked
    monkeypatch.setattr(tracing, "_ENV_PROVIDER", True)
    publisher.publish("hi", "email.x", "0s")
    assert len(_named(exporter, "publish")) == 1


def test_tracing_false_turns_it_off(
    memory_broker: MemoryBroker,
    spans: tuple[TracerProvider, InMemorySpanExporter],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    provider, exporter = spans
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    memory_broker.apply(TOPOLOGY)
    memory_broker.consumer(TOPOLOGY, "emails", lambda body: None, tracing=False)
    memory_broker.publisher(TOPOLOGY, tracing=False).publish("hi", "email.x", "0s")
    memory_broker.advance("1s")
    assert exporter.get_finished_spans() == ()


# Misuse ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "traceparent",
    ["garbage", "00-" + "0" * 32 + "-" + "0" * 16 + "-01", "00-zz-yy-01", 42, b"\xff\xfe", ""],
)
def test_a_malformed_traceparent_gives_a_new_root_and_the_message_is_handled(
    memory_broker: MemoryBroker,
    spans: tuple[TracerProvider, InMemorySpanExporter],
    traceparent: object,
) -> None:
    provider, exporter = spans
    memory_broker.apply(TOPOLOGY)
    got: list[str] = []
    memory_broker.consumer(TOPOLOGY, "emails", got.append, tracing=provider)
    # Another publisher's headers: delayq's own (untraced) sends them as given.
    publisher = memory_broker.publisher(TOPOLOGY, tracing=False)
    publisher.publish("hi", "email.x", "0s", headers={"traceparent": traceparent})
    memory_broker.advance("1s")
    assert got == ["hi"]
    [process] = _named(exporter, "process")
    assert process.parent is None and list(process.links) == []
    assert _attrs(process)["delayq.outcome"] == "ack"


def test_a_valid_context_in_bytes_from_another_client_is_followed(
    memory_broker: MemoryBroker, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    memory_broker.apply(TOPOLOGY)
    memory_broker.consumer(TOPOLOGY, "emails", lambda body: None, tracing=provider)
    trace_id, span_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    header = f"00-{trace_id}-{span_id}-01".encode()
    publisher = memory_broker.publisher(TOPOLOGY, tracing=False)
    publisher.publish("hi", "email.x", "0s", headers={"traceparent": header})
    memory_broker.advance("1s")
    [process] = _named(exporter, "process")
    assert f"{process.context.trace_id:032x}" == trace_id
    assert f"{process.links[0].context.span_id:016x}" == span_id


def test_a_retry_of_a_message_without_context_continues_its_first_attempts_trace(
    memory_broker: MemoryBroker, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    memory_broker.apply(TOPOLOGY)
    calls: list[int] = []
    memory_broker.consumer(TOPOLOGY, "emails", _fails_once(calls), policy=RETRY, tracing=provider)
    memory_broker.publisher(TOPOLOGY, tracing=False).publish("hi", "email.x", "0s")
    memory_broker.advance("2m")
    first, second = _named(exporter, "process")
    assert first.parent is None
    assert second.context.trace_id == first.context.trace_id
    assert second.links[0].context.span_id == first.context.span_id


def test_tracing_asked_for_without_opentelemetry_names_the_extra(
    memory_broker: MemoryBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tracing_module, "_TRACE", None)  # as if not installed
    memory_broker.apply(TOPOLOGY)
    with pytest.raises(MissingExtra, match=r"delayq\[otel\]") as caught:
        memory_broker.publisher(TOPOLOGY, tracing=True)
    assert isinstance(caught.value, ImportError)
    with pytest.raises(MissingExtra, match=r"delayq\[otel\]"):
        memory_broker.consumer(TOPOLOGY, "emails", lambda body: None, tracing=True)
    # Not asked for: nothing changes, nothing is imported.
    memory_broker.consumer(TOPOLOGY, "emails", lambda body: None)
    memory_broker.publisher(TOPOLOGY).publish("hi", "email.x", "1m")
    [waiting] = memory_broker.messages("shop.tier.1m")
    assert "traceparent" not in waiting.headers


def test_tracing_on_with_the_api_alone_and_no_provider_changes_nothing(
    memory_broker: MemoryBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)  # opentelemetry-api, no SDK set up
    memory_broker.apply(TOPOLOGY)
    got: list[str] = []
    memory_broker.consumer(TOPOLOGY, "emails", got.append, tracing=True)
    memory_broker.publisher(TOPOLOGY, tracing=True).publish("hi", "email.x", "1m")
    [waiting] = memory_broker.messages("shop.tier.1m")
    assert "traceparent" not in waiting.headers
    memory_broker.advance("1m")
    assert got == ["hi"]


def test_by_default_nothing_of_opentelemetry_is_imported() -> None:
    program = """
import sys
from delayq import Topology
from delayq.testing import MemoryBroker
topology = Topology(namespace="shop", ladder=["1m"],
                    destinations=[{"queue": "emails", "bindings": ["email.*"]}])
got = []
with MemoryBroker() as broker:
    broker.apply(topology)
    broker.consumer(topology, "emails", got.append)
    broker.publisher(topology).publish_many([Message("hi", "email.x", "1m")])
    broker.advance("1m")
assert got == ["hi"], got
loaded = sorted(name for name in sys.modules if name.startswith("opentelemetry"))
assert not loaded, loaded
""".replace("from delayq import Topology", "from delayq import Message, Topology")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_tracing_takes_a_bool_a_provider_or_none() -> None:
    with pytest.raises(InvalidInput, match="tracing= takes"):
        tracing_module.tracing_for("yes")  # type: ignore[arg-type]


class _Failing(SimpleSpanProcessor):
    """A span processor that raises where it is told to (an outside tester's)."""

    def __init__(self, where: str) -> None:
        super().__init__(InMemorySpanExporter())
        self.where = where

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if self.where == "start":
            raise RuntimeError("processor boom start")

    def on_end(self, span: ReadableSpan) -> None:
        if self.where == "end":
            raise RuntimeError("processor boom end")


class _FailingPropagator:
    fields = frozenset({"traceparent"})

    def inject(self, carrier: Any, context: Any = None, setter: Any = None) -> None:
        carrier["traceparent"] = "00-half-written"
        raise RuntimeError("propagator boom")

    def extract(self, carrier: Any, context: Any = None, getter: Any = None) -> Any:
        return context


@pytest.mark.parametrize("where", ["start", "end", "propagator"])
def test_tracing_that_raises_never_fails_a_publish(
    memory_broker: MemoryBroker,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    where: str,
) -> None:
    """A span processor or propagator that raises leaves the message untraced (no
    half-written context) and the publish as it would be untraced: logged once."""
    from opentelemetry import propagate

    provider = TracerProvider()
    provider.add_span_processor(_Failing(where))
    if where == "propagator":
        monkeypatch.setattr(propagate, "get_global_textmap", lambda: _FailingPropagator())
    memory_broker.apply(TOPOLOGY)
    publisher = memory_broker.publisher(TOPOLOGY, tracing=provider)
    with caplog.at_level(logging.ERROR, logger="delayq.tracing"):
        for n in range(3):
            publisher.publish(f"hi {n}", "email.x", "1m")
        publisher.publish_many([Message("many", "email.x", "1m")])
    waiting = memory_broker.messages("shop.tier.1m")
    assert len(waiting) == 4
    if where != "end":  # the span was started and its context injected before the end
        assert all("traceparent" not in m.headers for m in waiting)
    failures = [r for r in caplog.records if "tracing a publish failed" in r.getMessage()]
    assert len(failures) == 1
