"""PrometheusObserver against a fresh registry: known events give known counts and
histograms; publish events are built once for both publishers; no prometheus-client,
a clear error."""

from __future__ import annotations

import subprocess
import sys
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from delayq import FixedBackoff, Reject, Topology
from delayq.consume.delivery import Delivery
from delayq.consume.planner import DeliveryPlanner
from delayq.errors import (
    ConnectionFailed,
    MissingExtra,
    PublishBatchError,
    PublishBlocked,
    PublishUnconfirmed,
    Unroutable,
)
from delayq.message.envelope import OutgoingMessage, envelope_headers
from delayq.message.factory import MessageFactory
from delayq.observe.deliveries import Settled
from delayq.observe.metrics import METRICS, PrometheusObserver, serve_metrics
from delayq.observe.publishes import PublishObservers, PublishOutcome, published_events

QUEUE = "m.work"


def topology() -> Topology:
    return Topology(
        namespace="m", ladder=["1s", "5s"], destinations=[{"queue": QUEUE, "bindings": ["job.#"]}]
    )


PLANNER = DeliveryPlanner(
    topology(), QUEUE, policy=FixedBackoff(delay="1s", max_attempts=2), clock_ms=lambda: 50_000
)


def delivery(message_id: str, *, tier: str | None, delay_ms: int, attempt: int = 1) -> Delivery:
    tier_ms = {None: 0, "1s": 1000, "5s": 5000}[tier]
    headers = envelope_headers(delay_ms, tier, tier_ms, 10_000, attempt, "job.a")
    return Delivery(QUEUE, b'"x"', "job.a", message_id, "application/json", headers)


def settle(observer: PrometheusObserver, d: Delivery, decision, *, received: int, ms) -> None:
    observer.settled(Settled(d, decision, received, received + 5, ms))


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_settled_events_give_known_counts_and_histograms() -> None:
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry)
    assert observer.registry is registry
    # Due at 10_000 + delay; received 300 ms late (immediate) and 2.2 s late (tier 1s).
    ok = delivery("ok", tier=None, delay_ms=0)
    settle(observer, ok, PLANNER.success(), received=10_300, ms=20.0)
    late = delivery("late", tier="1s", delay_ms=800)
    settle(observer, late, PLANNER.success(), received=13_000, ms=2_000.0)
    dup = delivery("dup", tier=None, delay_ms=0)
    settle(observer, dup, PLANNER.duplicate(), received=10_300, ms=None)
    flaky = delivery("flaky", tier=None, delay_ms=0)
    settle(observer, flaky, PLANNER.failure(flaky, ValueError("a")), received=10_300, ms=1.0)
    spent = delivery("flaky", tier="1s", delay_ms=1000, attempt=2)
    settle(observer, spent, PLANNER.failure(spent, ValueError("b")), received=11_300, ms=1.0)
    bad = delivery("bad", tier=None, delay_ms=0)
    settle(observer, bad, PLANNER.failure(bad, Reject("no")), received=10_300, ms=1.0)

    for outcome, count in [("ack", 2), ("duplicate", 1), ("retry", 1), ("dead-letter", 2)]:
        assert value(registry, "delayq_delivered_total", queue=QUEUE, outcome=outcome) == count
    assert value(registry, "delayq_retried_total", queue=QUEUE) == 1
    assert value(registry, "delayq_duplicates_total", queue=QUEUE) == 1
    assert value(registry, "delayq_dead_lettered_total", queue=QUEUE, reason="exhausted") == 1
    assert value(registry, "delayq_dead_lettered_total", queue=QUEUE, reason="non-retryable") == 1

    # The handler ran for 5 deliveries (not the duplicate): 20 ms, 2 s and three of 1 ms.
    handler = "delayq_handler_duration_seconds"
    assert value(registry, f"{handler}_count", queue=QUEUE) == 5
    assert value(registry, f"{handler}_sum", queue=QUEUE) == pytest.approx(2.023)
    assert value(registry, f"{handler}_bucket", queue=QUEUE, le="0.005") == 3
    assert value(registry, f"{handler}_bucket", queue=QUEUE, le="0.025") == 4
    assert value(registry, f"{handler}_bucket", queue=QUEUE, le="2.5") == 5

    lateness = "delayq_lateness_seconds"
    assert value(registry, f"{lateness}_count", tier="immediate") == 4
    assert value(registry, f"{lateness}_sum", tier="immediate") == pytest.approx(1.2)
    assert value(registry, f"{lateness}_bucket", tier="immediate", le="0.25") == 0
    assert value(registry, f"{lateness}_bucket", tier="immediate", le="0.5") == 4
    assert value(registry, f"{lateness}_count", tier="1s") == 2  # late (2.2 s) and spent (0.3 s)
    assert value(registry, f"{lateness}_bucket", tier="1s", le="0.5") == 1
    assert value(registry, f"{lateness}_bucket", tier="1s", le="2.5") == 2


def test_labels_never_carry_message_ids_or_error_texts() -> None:
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry)
    d = delivery("secret-id-123", tier=None, delay_ms=0)
    settle(observer, d, PLANNER.failure(d, Reject("error text 456")), received=10_300, ms=1.0)
    msg = MessageFactory(topology(), new_id=lambda: "secret-id-789").build("x", "job.a", "1s")
    observer.published(published_events([msg], Unroutable("text 456", "secret-id-789"))[0])
    labels = {
        value
        for metric in registry.collect()
        for sample in metric.samples
        for name, value in sample.labels.items()
        if name != "le"
    }
    assert labels == {QUEUE, "dead-letter", "non-retryable", "immediate", "1s", "unroutable"}


def built(*delays: str) -> list[OutgoingMessage]:
    factory = MessageFactory(topology(), clock_ms=lambda: 1_000)
    return [factory.build({"n": i}, "job.a", d) for i, d in enumerate(delays)]


def test_publish_events_count_per_tier_and_outcome() -> None:
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry)
    observers = PublishObservers([observer])
    observers.emit(built("0s", "1s", "3s"))  # immediate, 1s, 5s
    observers.emit(built("1s"), Unroutable("gone", "m"))
    batch = built("0s", "1s", "1s")
    failures = {1: PublishUnconfirmed("x", "a"), 2: PublishBlocked("y", "b")}
    observers.emit(batch, PublishBatchError([batch[0].receipt, None, None], failures))
    observers.emit(built("5s"), ConnectionFailed("down"))

    assert value(registry, "delayq_published_total", tier="immediate") == 2
    assert value(registry, "delayq_published_total", tier="1s") == 1
    assert value(registry, "delayq_published_total", tier="5s") == 1
    failed = "delayq_publish_failed_total"
    assert value(registry, failed, tier="1s", reason="unroutable") == 1
    assert value(registry, failed, tier="1s", reason="unconfirmed") == 1
    assert value(registry, failed, tier="1s", reason="blocked") == 1
    assert value(registry, failed, tier="5s", reason="unreachable") == 1


def test_published_events_name_each_outcome() -> None:
    batch = built("0s", "1s")
    error = PublishBatchError([batch[0].receipt, None], {1: Unroutable("u", "m")})
    events = published_events(batch, error)
    assert [e.outcome for e in events] == [PublishOutcome.CONFIRMED, PublishOutcome.UNROUTABLE]
    assert events[0].error is None and isinstance(events[1].error, Unroutable)
    assert [e.tier for e in events] == ["immediate", "1s"]
    assert published_events(batch, RuntimeError("?"))[1].outcome is PublishOutcome.FAILED


def test_a_failing_publish_observer_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    class Bad:
        def published(self, event: object) -> None:
            raise RuntimeError("bug")

    observers = PublishObservers([Bad()])
    observers.emit(built("0s", "1s"))
    assert sum("observer" in r.getMessage() for r in caplog.records) == 1


def test_every_metric_is_registered_under_its_documented_name() -> None:
    registry = CollectorRegistry()
    PrometheusObserver(registry)
    names = {m.name + ("_total" if m.type == "counter" else "") for m in registry.collect()}
    assert names == set(METRICS)


def test_the_endpoint_serves_the_registry_on_a_free_port() -> None:
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry)
    observer.published(published_events(built("1s"))[0])
    server = serve_metrics(registry, 0)
    try:
        assert server.port > 0 and server.host == "127.0.0.1"
        with urllib.request.urlopen(server.url, timeout=10) as response:
            text = response.read().decode()
    finally:
        server.close()
    assert 'delayq_published_total{tier="1s"} 1.0' in text


def test_without_prometheus_client_the_module_imports_and_the_observer_says_which_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code = (
        "import sys; sys.modules['prometheus_client'] = None\n"
        "import delayq.observe.metrics\n"
        "try:\n"
        "    delayq.observe.metrics.PrometheusObserver()\n"
        "except delayq.MissingExtra as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "pip install 'delayq[metrics]'" in result.stdout
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(MissingExtra, match=r"delayq\[metrics\]") as raised:
        serve_metrics(CollectorRegistry(), 0)
    assert isinstance(raised.value, ImportError) and raised.value.extra == "metrics"


def test_a_delivery_counted_as_delivered_is_already_in_every_other_series() -> None:
    """delivered_total goes up last, so a reader who waits on it (a test, an alert's
    ratio) never sees it ahead of the fate, duration and lateness of the same delivery."""
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry)
    seen: list[tuple[float | None, ...]] = []
    child = observer.delivered_total.labels(QUEUE, "dead-letter")
    inc = child.inc

    def snapshot_then_inc(amount: float = 1) -> None:
        seen.append(
            (
                value(registry, "delayq_dead_lettered_total", queue=QUEUE, reason="non-retryable"),
                value(registry, "delayq_handler_duration_seconds_count", queue=QUEUE),
                value(registry, "delayq_lateness_seconds_count", tier="immediate"),
            )
        )
        inc(amount)

    child.inc = snapshot_then_inc  # type: ignore[method-assign]
    bad = delivery("bad", tier=None, delay_ms=0)
    settle(observer, bad, PLANNER.failure(bad, Reject("no")), received=10_300, ms=1.0)
    assert seen == [(1.0, 1.0, 1.0)]


def test_the_watchdogs_samples_set_the_parked_gauge_per_queue() -> None:
    from delayq.ops.watchdog import Watchdog

    class API:
        url = "http://fake/"

        def __init__(self, rows: list[dict[str, object]]) -> None:
            self.rows = rows

        def queues(self, vhost: str, columns: tuple[str, ...] = ()) -> list[dict[str, object]]:
            return self.rows

    def row(name: str, messages: int) -> dict[str, object]:
        return {"name": name, "type": "quorum", "leader": "rabbit@a", "members": ["rabbit@a"],
                "online": ["rabbit@a"], "messages": messages, "messages_ready": 0,
                "messages_unacknowledged": 0}  # fmt: skip

    metrics = PrometheusObserver()
    api = API([row("m.tier.1s", 7), row("m.tier.5s", 0), row(QUEUE, 99)])
    dog = Watchdog(topology(), [api], observers=[metrics])  # type: ignore[list-item]
    dog.look()
    assert value(metrics.registry, "delayq_parked_messages", queue="m.tier.1s") == 7
    assert value(metrics.registry, "delayq_parked_messages", queue="m.tier.5s") == 0
    assert value(metrics.registry, "delayq_parked_messages", queue=QUEUE) is None  # not a tier
    api.rows = [row("m.tier.1s", 2)]
    dog.look()
    assert value(metrics.registry, "delayq_parked_messages", queue="m.tier.1s") == 2
