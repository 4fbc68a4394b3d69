"""A DLQ replay in the trace (issue 29, item 7): a ``replay`` span per replayed message in
the message's own trace, and attempts after a replay that say so (memory broker)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from delayq import Topology
from delayq.consume.delivery import Delivery
from delayq.consume.retry import FixedBackoff
from delayq.observe.carrier import (
    H_PREVIOUS_ATTEMPTS,
    H_REPLAYS,
    replay_attributes,
    replay_history,
)
from delayq.ops.parked import replay_message
from delayq.testing import MemoryBroker

TOPOLOGY = Topology(
    namespace="shop",
    ladder=["1m", "5m"],
    destinations=[{"queue": "emails", "bindings": ["email.*"]}],
)


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


class Failing:
    """Fails while ``failures`` lasts (one popped per call), then succeeds."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def __call__(self, body: Any) -> None:
        self.calls += 1
        if self.failures:
            self.failures -= 1
            raise ConnectionError("smtp down")


def _parked(headers: dict[str, Any]) -> Delivery:
    return Delivery("emails.dlq", b"{}", "emails", "m-1", "application/json", headers)


# The history a replayed copy carries ------------------------------------------------------


def test_a_replayed_copy_counts_its_replays_and_the_attempts_before_them() -> None:
    first = replay_message(
        _parked({"delayq-attempt": 3}), exchange="", routing_key="emails", now_ms=1
    )
    assert first.headers["delayq-attempt"] == 1  # the retry budget starts over, as documented
    assert (first.headers[H_REPLAYS], first.headers[H_PREVIOUS_ATTEMPTS]) == (1, 3)
    again = replay_message(
        _parked({**first.headers, "delayq-attempt": 2}), exchange="", routing_key="emails", now_ms=2
    )
    assert (again.headers[H_REPLAYS], again.headers[H_PREVIOUS_ATTEMPTS]) == (2, 5)


@pytest.mark.parametrize("bad", [True, -1, 0, "3", 1.5, None])
def test_a_malformed_history_counts_as_none(bad: object) -> None:
    history = replay_history(_parked({H_REPLAYS: bad, H_PREVIOUS_ATTEMPTS: bad}))
    assert history == {H_REPLAYS: 1, H_PREVIOUS_ATTEMPTS: 1}
    assert replay_attributes({H_REPLAYS: bad}) == {}


def test_a_message_never_replayed_has_no_replay_attributes() -> None:
    assert replay_attributes({"delayq-attempt": 2}) == {}
    assert replay_attributes({H_REPLAYS: 2, H_PREVIOUS_ATTEMPTS: 4}) == {
        "delayq.replayed": True,
        "delayq.replay_count": 2,
        "delayq.previous_attempts": 4,
    }


# Spans on the memory broker -------------------------------------------------------------


def test_a_traced_replay_is_a_span_of_the_messages_trace_and_the_parent_of_what_follows(
    memory_broker: MemoryBroker, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    memory_broker.apply(TOPOLOGY)
    handler = Failing(3)  # attempts 1 and 2 fail (DLQ), then attempt 1 after the replay
    policy = FixedBackoff(delay="1m", max_attempts=2)
    memory_broker.consumer(TOPOLOGY, "emails", handler, policy=policy, tracing=provider)
    memory_broker.publisher(TOPOLOGY, tracing=provider).publish("hi", "email.x", "0s")
    memory_broker.advance("3m")
    assert len(memory_broker.dlq("emails")) == 1
    assert memory_broker.replay_dlq("emails", tracing=provider) != []
    memory_broker.advance("3m")
    assert handler.calls == 4

    [publish] = _named(exporter, "publish")
    [replay] = _named(exporter, "replay")
    before_1, before_2, after_1, after_2 = _named(exporter, "process")
    trace_id = publish.context.trace_id
    spans_ = (replay, before_1, before_2, after_1, after_2)
    assert {s.context.trace_id for s in spans_} == {trace_id}
    assert replay.name == "replay emails.dlq" and replay.kind is SpanKind.PRODUCER
    assert replay.parent is not None and replay.parent.span_id == publish.context.span_id
    assert [link.context.span_id for link in replay.links] == [publish.context.span_id]
    sent = _attrs(replay)
    assert sent["messaging.operation.name"] == "replay"
    assert sent["messaging.rabbitmq.destination.routing_key"] == "emails"
    assert sent["delayq.parked_queue"] == "emails.dlq"
    assert (sent["delayq.replay_count"], sent["delayq.previous_attempts"]) == (1, 2)
    assert sent["delayq.parked_reason"] == "exhausted"
    assert sent["delayq.parked_error_type"] == "builtins.ConnectionError"
    for before in (before_1, before_2):
        assert "delayq.replayed" not in _attrs(before)
        assert before.parent is not None and before.parent.span_id == publish.context.span_id
    # Every attempt after the replay is its child, numbered from 1 (a fresh retry budget)
    # and saying how many attempts came before.
    for attempt, after in enumerate((after_1, after_2), start=1):
        attrs = _attrs(after)
        assert after.parent is not None and after.parent.span_id == replay.context.span_id
        assert after.links[0].context.span_id == replay.context.span_id
        assert attrs["delayq.attempt"] == attempt
        assert attrs["delayq.replayed"] is True
        assert (attrs["delayq.replay_count"], attrs["delayq.previous_attempts"]) == (1, 2)
    assert [_attrs(s)["delayq.outcome"] for s in (after_1, after_2)] == ["retry", "ack"]


def test_a_second_replay_counts_two_and_every_attempt_before_it(
    memory_broker: MemoryBroker, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    memory_broker.apply(TOPOLOGY)
    handler = Failing(2)
    policy = FixedBackoff(delay="1m", max_attempts=1)
    memory_broker.consumer(TOPOLOGY, "emails", handler, policy=policy, tracing=provider)
    memory_broker.publisher(TOPOLOGY, tracing=provider).publish("hi", "email.x", "0s")
    for _ in range(2):
        memory_broker.advance("1s")
        assert len(memory_broker.replay_dlq("emails", tracing=provider)) == 1
    memory_broker.advance("1s")
    assert handler.calls == 3
    first, second = _named(exporter, "replay")
    assert second.parent is not None and second.parent.span_id == first.context.span_id
    assert (_attrs(second)["delayq.replay_count"], _attrs(second)["delayq.previous_attempts"]) == (
        2,
        2,
    )
    last = _named(exporter, "process")[-1]
    assert _attrs(last)["delayq.outcome"] == "ack" and _attrs(last)["delayq.attempt"] == 1
    assert (_attrs(last)["delayq.replay_count"], _attrs(last)["delayq.previous_attempts"]) == (2, 2)
    assert last.parent is not None and last.parent.span_id == second.context.span_id


def test_a_parked_message_without_context_gets_one_from_its_replay(
    memory_broker: MemoryBroker, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    memory_broker.apply(TOPOLOGY)
    handler = Failing(1)
    policy = FixedBackoff(delay="1m", max_attempts=1)
    memory_broker.consumer(TOPOLOGY, "emails", handler, policy=policy, tracing=False)
    memory_broker.publisher(TOPOLOGY, tracing=False).publish("hi", "email.x", "0s")
    memory_broker.advance("1s")
    [parked] = memory_broker.dlq("emails")
    assert "traceparent" not in parked.headers
    with provider.get_tracer("ops").start_as_current_span("nightly replay") as job:
        memory_broker.replay_dlq("emails", tracing=provider)
    [replay] = _named(exporter, "replay")
    # No context of its own: the replay is the child of the caller's current span.
    assert replay.parent is not None and replay.parent.span_id == job.get_span_context().span_id
    assert list(replay.links) == []
    [copy] = memory_broker.messages("emails")
    assert copy.headers["traceparent"].split("-")[2] == f"{replay.context.span_id:016x}"


def test_the_caller_s_span_is_linked_when_the_message_has_its_own_trace(
    memory_broker: MemoryBroker, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    memory_broker.apply(TOPOLOGY)
    policy = FixedBackoff(delay="1m", max_attempts=1)
    memory_broker.consumer(TOPOLOGY, "emails", Failing(1), policy=policy, tracing=provider)
    memory_broker.publisher(TOPOLOGY, tracing=provider).publish("hi", "email.x", "0s")
    memory_broker.advance("1s")
    with provider.get_tracer("ops").start_as_current_span("nightly replay") as job:
        memory_broker.replay_dlq("emails", tracing=provider)
    [publish] = _named(exporter, "publish")
    [replay] = _named(exporter, "replay")
    assert replay.context.trace_id == publish.context.trace_id
    links = {link.context.span_id: dict(link.attributes or {}) for link in replay.links}
    assert links == {
        publish.context.span_id: {"delayq.link": "parked"},
        job.get_span_context().span_id: {"delayq.link": "replayer"},
    }


def test_an_unrouted_replay_is_traced_too(
    memory_broker: MemoryBroker, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    # A key bound outside the topology (external_bindings) that no queue binds yet.
    topology = Topology(
        namespace="shop",
        ladder=["1m"],
        destinations=[{"queue": "emails", "bindings": ["email.*"]}],
        external_bindings=["nobody.*"],
    )
    memory_broker.apply(topology)
    memory_broker.publisher(topology, tracing=provider).publish("hi", "nobody.x", "0s")
    memory_broker.advance("1s")
    assert len(memory_broker.unrouted(topology)) == 1
    memory_broker.replay_unrouted(topology, tracing=provider)  # comes straight back
    [publish] = _named(exporter, "publish")
    [replay] = _named(exporter, "replay")
    assert replay.name == "replay shop.unrouted"
    assert replay.parent is not None and replay.parent.span_id == publish.context.span_id
    assert _attrs(replay)["messaging.destination.name"] == topology.ready_exchange
    assert _attrs(replay)["messaging.rabbitmq.destination.routing_key"] == "nobody.x"


def test_an_untraced_replay_starts_no_span_and_keeps_the_original_context(
    memory_broker: MemoryBroker,
    spans: tuple[TracerProvider, InMemorySpanExporter],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    provider, exporter = spans
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)  # the application set no provider
    memory_broker.apply(TOPOLOGY)
    policy = FixedBackoff(delay="1m", max_attempts=1)
    memory_broker.consumer(TOPOLOGY, "emails", Failing(1), policy=policy, tracing=provider)
    memory_broker.publisher(TOPOLOGY, tracing=provider).publish("hi", "email.x", "0s")
    memory_broker.advance("1s")
    [parked] = memory_broker.dlq("emails")
    memory_broker.replay_dlq("emails")
    assert _named(exporter, "replay") == []
    [copy] = memory_broker.messages("emails")
    assert copy.headers["traceparent"] == parked.headers["traceparent"]
    memory_broker.advance("1s")
    # Still told apart from a first attempt: the history is a header, traced or not.
    after = _named(exporter, "process")[-1]
    assert _attrs(after)["delayq.replayed"] is True
    assert _attrs(after)["delayq.previous_attempts"] == 1


def test_a_tracer_that_fails_never_stops_a_replay(memory_broker: MemoryBroker) -> None:
    memory_broker.apply(TOPOLOGY)
    policy = FixedBackoff(delay="1m", max_attempts=1)
    memory_broker.consumer(TOPOLOGY, "emails", Failing(1), policy=policy, tracing=False)
    memory_broker.publisher(TOPOLOGY, tracing=False).publish("hi", "email.x", "0s")
    memory_broker.advance("1s")

    class Broken:
        def get_tracer(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("exporter misconfigured")

    assert len(memory_broker.replay_dlq("emails", tracing=Broken())) == 1  # type: ignore[arg-type]
    assert memory_broker.dlq("emails") == []
