"""Metrics and log context against a real broker, through both adapters: a consumer and a
publisher with a PrometheusObserver on a short ladder, a known mix of fates, then the
HTTP endpoint scraped for the exact counts; the handler's JSON log lines carry each
delivery's message id, queue, original routing key and attempt; failed publishes are
counted by reason."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from delayq import FixedBackoff, Message, Topology, TopologyMissing
from delayq.aio import AsyncPublisher
from delayq.observe.logs import DeliveryLogFilter, JsonLogFormatter
from delayq.observe.metrics import PrometheusObserver, serve_metrics
from delayq.stores.memory import InMemoryStore
from delayq.sync import Publisher, apply_topology

from .test_consumer import until

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> tuple[str, Samples]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return text, samples


def publish(
    driver_kind: str, url: str, topo: Topology, metrics: PrometheusObserver, *messages: Message
) -> None:
    """A batch (or a single publish for one message) through this test's adapter."""
    if driver_kind == "sync":
        with Publisher(url, topo, observers=[metrics]) as pub:
            if len(messages) == 1:
                m = messages[0]
                pub.publish(m.body, m.routing_key, m.delay, message_id=m.message_id)
            else:
                pub.publish_many(list(messages))
        return

    async def run() -> None:
        async with AsyncPublisher(url, topo, observers=[metrics]) as pub:
            if len(messages) == 1:
                m = messages[0]
                await pub.publish(m.body, m.routing_key, m.delay, message_id=m.message_id)
            else:
                await pub.publish_many(list(messages))

    asyncio.run(run())


@pytest.fixture
def json_lines() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """The handler's logger, writing JSON lines with the delivery's fields."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(DeliveryLogFilter())
    handler.setFormatter(JsonLogFormatter())
    logger = logging.getLogger("tests.metrics.handler")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield logger, out
    logger.removeHandler(handler)


def test_the_endpoint_counts_a_known_run_and_handler_logs_carry_the_delivery(
    driver_kind: str, make_topology, rabbitmq_url: str, start_consumer, json_lines
) -> None:
    topo = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    apply_topology(topo, rabbitmq_url)
    logger, out = json_lines
    metrics = PrometheusObserver()
    server = serve_metrics(metrics.registry, 0)

    def settled() -> float:
        outcomes = ("ack", "duplicate", "retry", "dead-letter")
        return sum(
            metrics.registry.get_sample_value(
                "delayq_delivered_total", {"queue": queue, "outcome": o}
            )
            or 0
            for o in outcomes
        )

    class Seen:
        def __init__(self) -> None:
            self.ids: list[str | None] = []

        def settled(self, event: Any) -> None:
            self.ids.append(event.message_id)

    seen = Seen()

    def handler(value: dict[str, Any]) -> None:
        logger.info("handling %s", value["key"])
        if value["key"] == "fail":
            raise ValueError("always")

    try:
        start_consumer(
            topo,
            queue,
            handler,
            policy=FixedBackoff(delay="1s", max_attempts=2),
            store=InMemoryStore(),
            key=lambda value: value["key"],
            observers=[metrics, seen],
        )
        publish(
            driver_kind,
            rabbitmq_url,
            topo,
            metrics,
            Message({"key": "a"}, "job.a", "0s", message_id="id-ok-1"),
            Message({"key": "b"}, "job.b", "1s", message_id="id-ok-2"),
            Message({"key": "fail"}, "job.fail", "0s", message_id="id-fail"),
        )
        assert until(lambda: "id-ok-1" in seen.ids, 15)  # done: its key is recorded
        # Same key as ok-1 under a new message id: a duplicate, skipped.
        publish(
            driver_kind,
            rabbitmq_url,
            topo,
            metrics,
            Message({"key": "a"}, "job.a", "0s", message_id="id-dup"),
        )
        # ok-1, dup, ok-2 (after 1 s), fail: retried once (1 s), then dead-lettered. `seen`
        # hears of a delivery after `metrics` counted all of it (delivered_total comes first).
        assert until(lambda: len(seen.ids) >= 5, 20), (settled(), seen.ids)
        text, samples = scrape(server.url)
    finally:
        server.close()

    def sample(name: str, **labels: str) -> float | None:
        return samples.get((name, frozenset(labels.items())))

    q = {"queue": queue}
    assert sample("delayq_delivered_total", **q, outcome="ack") == 2
    assert sample("delayq_delivered_total", **q, outcome="duplicate") == 1
    assert sample("delayq_delivered_total", **q, outcome="retry") == 1
    assert sample("delayq_delivered_total", **q, outcome="dead-letter") == 1
    assert sample("delayq_retried_total", **q) == 1
    assert sample("delayq_duplicates_total", **q) == 1
    assert sample("delayq_dead_lettered_total", **q, reason="exhausted") == 1
    # The handler ran 4 times: ok-1, ok-2 and both attempts of fail (not for the duplicate).
    assert sample("delayq_handler_duration_seconds_count", **q) == 4
    # Waited in no tier: ok-1, dup, fail's first attempt; in 1s: ok-2, fail's retry.
    assert sample("delayq_lateness_seconds_count", tier="immediate") == 3
    assert sample("delayq_lateness_seconds_count", tier="1s") == 2
    # The publisher's side (the consumer's own republishes are retries, counted above).
    assert sample("delayq_published_total", tier="immediate") == 3
    assert sample("delayq_published_total", tier="1s") == 1
    assert not [key for key in samples if key[0] == "delayq_publish_failed_total"]
    for message_id in ("id-ok-1", "id-ok-2", "id-fail", "id-dup"):
        assert message_id not in text  # no message ids in labels

    entries = [json.loads(line) for line in out.getvalue().splitlines()]
    fields = sorted(
        (e["message_id"], e["queue"], e["routing_key"], e["attempt"], e["message"]) for e in entries
    )
    assert fields == [
        ("id-fail", queue, "job.fail", 1, "handling fail"),
        ("id-fail", queue, "job.fail", 2, "handling fail"),  # the original key, not the retry hop
        ("id-ok-1", queue, "job.a", 1, "handling a"),
        ("id-ok-2", queue, "job.b", 1, "handling b"),
    ]


def test_publishes_that_fail_are_counted_by_reason(
    driver_kind: str, make_topology, rabbitmq_url: str
) -> None:
    topo = make_topology(["1s"])  # not applied: its exchanges do not exist
    metrics = PrometheusObserver()
    single = Message({"n": 1}, "job.a", "1s")
    batch = [Message({"n": 2}, "job.a", "1s"), Message({"n": 3}, "job.a", "0s")]
    for messages in ([single], batch):
        with pytest.raises(TopologyMissing):
            publish(driver_kind, rabbitmq_url, topo, metrics, *messages)
    failed = "delayq_publish_failed_total"
    registry = metrics.registry
    assert registry.get_sample_value(failed, {"tier": "1s", "reason": "missing"}) == 2
    assert registry.get_sample_value(failed, {"tier": "immediate", "reason": "missing"}) == 1
    assert registry.get_sample_value("delayq_published_total", {"tier": "1s"}) is None
