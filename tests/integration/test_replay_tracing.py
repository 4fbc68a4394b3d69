"""A DLQ replay in the trace on a real broker (issue 29, item 7): the replay is a span of
the message's trace, through the API and `delayq dlq replay`, and the attempts after it
are its children and say they follow a replay (both adapters)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from delayq import FixedBackoff
from delayq.cli import main
from delayq.sync import Publisher, apply_topology, parking
from tests.waiting import wait_for


@pytest.fixture
def traced() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


class Failing:
    """Fails its first ``failures`` calls, then succeeds."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self, body: Any) -> None:
        with self._lock:
            self.calls += 1
            if self.calls <= self.failures:
                raise ConnectionError("smtp down")


def _spans(exporter: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    found = [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]
    return sorted(found, key=lambda s: s.start_time or 0)


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def _outcomes(exporter: InMemorySpanExporter) -> list[str]:
    return [str(_attrs(s).get("delayq.outcome")) for s in _spans(exporter, "process")]


def _child_of(span: ReadableSpan, parent: ReadableSpan) -> bool:
    return span.parent is not None and span.parent.span_id == parent.context.span_id


def test_a_replay_through_the_api_is_a_span_and_the_parent_of_the_attempts_after_it(
    make_topology, rabbitmq_url, start_consumer, traced
):
    provider, exporter = traced
    topology = make_topology(["1s", "2s"])
    queue = f"{topology.namespace}.work"
    apply_topology(topology, rabbitmq_url)
    # Attempts 1 and 2 fail (dead-lettered), then the first after the replay (retried).
    handle = start_consumer(
        topology,
        queue,
        Failing(3),
        policy=FixedBackoff(delay="1s", max_attempts=2),
        tracing=provider,
    )
    with Publisher(rabbitmq_url, topology, tracing=provider) as publisher:
        receipt = publisher.publish({"to": "a@b.c"}, "job.mail", "1s")
    wait_for(lambda: handle.stats.dead_lettered == 1, 30, "the message in the DLQ")

    report = parking.replay(
        rabbitmq_url,
        f"{queue}.dlq",
        topology,
        target=lambda parked: ("", queue),
        tracing=provider,
    )
    assert report.replayed == [receipt.message_id]
    expected = ["retry", "dead-letter", "retry", "ack"]
    wait_for(lambda: _outcomes(exporter) == expected, 30, lambda: str(_outcomes(exporter)))

    [publish] = _spans(exporter, "publish")
    [replay] = _spans(exporter, "replay")
    before_1, before_2, after_1, after_2 = _spans(exporter, "process")
    every = (replay, before_1, before_2, after_1, after_2)
    assert {s.context.trace_id for s in every} == {publish.context.trace_id}
    assert replay.name == f"replay {queue}.dlq" and replay.kind is SpanKind.PRODUCER
    assert _child_of(replay, publish)
    assert [link.context.span_id for link in replay.links] == [publish.context.span_id]
    sent = _attrs(replay)
    assert sent["messaging.message.id"] == receipt.message_id
    assert sent["messaging.destination.name"] == "amq.default"
    assert sent["messaging.rabbitmq.destination.routing_key"] == queue
    assert (sent["delayq.replay_count"], sent["delayq.previous_attempts"]) == (1, 2)
    assert sent["delayq.parked_reason"] == "exhausted"
    assert "error.type" not in sent  # confirmed
    assert [_attrs(s)["delayq.attempt"] for s in (before_1, before_2)] == [1, 2]
    assert not any("delayq.replayed" in _attrs(s) for s in (before_1, before_2))
    # After the replay: a fresh retry budget (attempt 1, 2), its history, its children.
    for attempt, after in enumerate((after_1, after_2), start=1):
        attrs = _attrs(after)
        assert _child_of(after, replay)
        assert after.links[0].context.span_id == replay.context.span_id
        assert attrs["delayq.attempt"] == attempt
        assert attrs["delayq.replayed"] is True
        assert (attrs["delayq.replay_count"], attrs["delayq.previous_attempts"]) == (1, 2)


def test_a_replay_by_the_cli_under_a_global_provider_is_traced_and_counted_twice(
    make_topology,
    rabbitmq_url,
    start_consumer,
    traced,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    provider, exporter = traced
    # What `opentelemetry-instrument delayq dlq replay ...` sets up: a global provider.
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    topology = make_topology(["1s", "2s"])
    queue = f"{topology.namespace}.work"
    apply_topology(topology, rabbitmq_url)
    handle = start_consumer(
        topology, queue, Failing(2), policy=FixedBackoff(delay="1s", max_attempts=1)
    )
    with Publisher(rabbitmq_url, topology) as publisher:
        publisher.publish({"to": "a@b.c"}, "job.mail", "1s")
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
    replay = ["dlq", "replay", queue, "--all", "--file", str(path), "--url", rabbitmq_url]
    for parked in (1, 2):
        wait_for(lambda n=parked: handle.stats.dead_lettered == n, 30, "the message in the DLQ")
        assert main(replay) == 0
    expected = ["dead-letter", "dead-letter", "ack"]
    wait_for(lambda: _outcomes(exporter) == expected, 30, lambda: str(_outcomes(exporter)))

    [publish] = _spans(exporter, "publish")
    first, second = _spans(exporter, "replay")
    dead, dead_again, done = _spans(exporter, "process")
    every = (first, second, dead, dead_again, done)
    assert {s.context.trace_id for s in every} == {publish.context.trace_id}
    assert _child_of(first, publish) and _child_of(dead_again, first)
    assert _child_of(second, first) and _child_of(done, second)
    counts = [
        (_attrs(s)["delayq.replay_count"], _attrs(s)["delayq.previous_attempts"])
        for s in (first, second, dead_again, done)
    ]
    assert counts == [(1, 1), (2, 2), (1, 1), (2, 2)]
    assert [_attrs(s)["delayq.attempt"] for s in (dead, dead_again, done)] == [1, 1, 1]
