"""One trace across the delay on a real broker: publish, every attempt, the final ack,
and a dead letter replayed by `delayq dlq replay` (both adapters; issue 17)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
import yaml
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from delayq import FixedBackoff
from delayq.cli import main
from delayq.sync import Publisher, apply_topology
from tests.waiting import wait_for


@pytest.fixture
def traced() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


class FailsOnce:
    """Fails its first call; each call opens a span of its own (in the handler's thread)."""

    def __init__(self, provider: TracerProvider) -> None:
        self.tracer = provider.get_tracer("app")
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self, body: Any) -> None:
        with self.tracer.start_as_current_span("smtp"), self._lock:
            self.calls += 1
            if self.calls == 1:
                raise ConnectionError("smtp down")


def _spans(exporter: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]


def _outcomes(exporter: InMemorySpanExporter) -> list[str]:
    return [str((s.attributes or {}).get("delayq.outcome")) for s in _spans(exporter, "process")]


def test_publish_a_failed_attempt_its_retry_and_the_ack_share_one_trace(
    make_topology, rabbitmq_url, start_consumer, traced
):
    provider, exporter = traced
    topology = make_topology(["1s", "2s"])
    queue = f"{topology.namespace}.work"
    apply_topology(topology, rabbitmq_url)
    handler = FailsOnce(provider)
    start_consumer(
        topology,
        queue,
        handler,
        policy=FixedBackoff(delay="1s", max_attempts=3),
        tracing=provider,
    )
    with Publisher(rabbitmq_url, topology, tracing=provider) as publisher:
        receipt = publisher.publish({"to": "a@b.c"}, "job.mail", "2s")

    wait_for(lambda: _outcomes(exporter) == ["retry", "ack"], 30, lambda: str(_outcomes(exporter)))
    [publish] = _spans(exporter, "publish")
    first, second = _spans(exporter, "process")
    trace_id = publish.context.trace_id
    assert [s.context.trace_id for s in (first, second)] == [trace_id, trace_id]
    assert publish.kind is SpanKind.PRODUCER and first.kind is SpanKind.CONSUMER
    for process in (first, second):
        [link] = process.links
        assert link.context.span_id == publish.context.span_id
    # The handler's own spans are children of their attempt's process span.
    parents = sorted(s.parent.span_id for s in _spans(exporter, "smtp") if s.parent)
    assert parents == sorted([first.context.span_id, second.context.span_id])
    sent = dict(publish.attributes or {})
    assert sent["messaging.system"] == "rabbitmq"
    assert sent["messaging.message.id"] == receipt.message_id
    assert (sent["delayq.delay_ms"], sent["delayq.tier"]) == (2000, "2s")
    one, two = dict(first.attributes or {}), dict(second.attributes or {})
    assert (one["delayq.attempt"], two["delayq.attempt"]) == (1, 2)
    assert one["error.type"] == "ConnectionError" and first.status.status_code is StatusCode.ERROR
    assert one["delayq.retry_delay_ms"] == 1000
    assert one["delayq.tier"] == "2s" and two["delayq.tier"] == "1s"
    for attrs in (one, two):
        assert attrs["messaging.destination.name"] == queue
        assert attrs["messaging.message.id"] == receipt.message_id
        assert attrs["delayq.lateness_ms"] >= 0 and attrs["delayq.handler_ms"] >= 0


def test_a_dead_letter_replayed_by_the_cli_is_handled_in_the_original_trace(
    make_topology, rabbitmq_url, start_consumer, traced, tmp_path: Path
):
    provider, exporter = traced
    topology = make_topology(["1s", "2s"])
    queue = f"{topology.namespace}.work"
    apply_topology(topology, rabbitmq_url)
    handler = FailsOnce(provider)
    handle = start_consumer(
        topology, queue, handler, policy=FixedBackoff(delay="1s", max_attempts=1), tracing=provider
    )
    with Publisher(rabbitmq_url, topology, tracing=provider) as publisher:
        publisher.publish({"to": "a@b.c"}, "job.mail", "2s")
    wait_for(lambda: handle.stats.dead_lettered == 1, 30, "the message in the DLQ")

    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
    code = main(["dlq", "replay", queue, "--all", "--file", str(path), "--url", rabbitmq_url])
    assert code == 0
    expected = ["dead-letter", "ack"]
    wait_for(lambda: _outcomes(exporter) == expected, 30, lambda: str(_outcomes(exporter)))
    [publish] = _spans(exporter, "publish")
    dead, replayed = _spans(exporter, "process")
    assert dead.context.trace_id == replayed.context.trace_id == publish.context.trace_id
    assert replayed.links[0].context.span_id == publish.context.span_id
    attrs = dict(replayed.attributes or {})
    assert attrs["delayq.attempt"] == 1  # a replay starts over: a fresh retry budget
    assert (attrs["delayq.replay_count"], attrs["delayq.previous_attempts"]) == (1, 1)


def test_messages_of_another_publisher_are_handled_with_or_without_a_valid_context(
    make_topology, rabbitmq_url, start_consumer, traced
):
    provider, exporter = traced
    topology = make_topology(["1s"])
    queue = f"{topology.namespace}.work"
    apply_topology(topology, rabbitmq_url)
    got: list[str] = []
    start_consumer(topology, queue, got.append, tracing=provider)
    trace_id, span_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    sent = {
        "garbage": {"traceparent": "not-a-context"},
        "number": {"traceparent": 7},
        "none": {},
        "valid": {"traceparent": f"00-{trace_id}-{span_id}-01"},
    }
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        channel = connection.channel()
        for name, headers in sent.items():
            properties = pika.BasicProperties(
                content_type="text/plain", message_id=name, headers=headers
            )
            channel.basic_publish(topology.ready_exchange, "job.x", name.encode(), properties)
    finally:
        connection.close()
    wait_for(lambda: len(_spans(exporter, "process")) == 4, 30, lambda: str(got))
    assert sorted(got) == sorted(sent)
    by_id = {(s.attributes or {})["messaging.message.id"]: s for s in _spans(exporter, "process")}
    for name in ("garbage", "number", "none"):
        assert by_id[name].parent is None and list(by_id[name].links) == [], name
        assert (by_id[name].attributes or {})["delayq.outcome"] == "ack"
    valid = by_id["valid"]
    assert f"{valid.context.trace_id:032x}" == trace_id
    assert f"{valid.links[0].context.span_id:016x}" == span_id
