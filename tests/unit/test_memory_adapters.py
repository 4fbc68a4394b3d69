"""delayq's own publishers and consumers on the memory broker, on virtual time."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from delayq import Topology
from delayq.aio import AsyncConsumer, AsyncPublisher
from delayq.consume.delivery import H_ERROR_TYPE, Retry
from delayq.consume.retry import ROCKETMQ_SCHEDULE, FixedBackoff, ScheduleBackoff
from delayq.errors import InvalidInput, TopologyMissing, Unroutable
from delayq.message.envelope import H_ATTEMPT, Message
from delayq.stores.memory import InMemoryStore
from delayq.sync import Consumer, Publisher
from delayq.testing import MemoryBroker
from delayq.testing.links import AsyncMemoryFeed, AsyncMemoryLink, MemoryFeed, MemoryLink

TOPOLOGY = Topology(
    namespace="shop",
    ladder=["1m", "5m", "15m", "1h"],
    destinations=[
        {"queue": "emails", "bindings": ["email.*"]},
        {"queue": "audit", "bindings": ["#"]},
    ],
)


def test_a_memory_url_builds_the_memory_adapters(memory_broker: MemoryBroker) -> None:
    publisher = Publisher(memory_broker.url, TOPOLOGY)
    consumer = Consumer(memory_broker.url, TOPOLOGY, "emails", lambda body: None)
    assert type(publisher) is Publisher and isinstance(publisher.link, MemoryLink)
    assert type(consumer) is Consumer and isinstance(consumer.feed, MemoryFeed)
    assert isinstance(AsyncPublisher(memory_broker.url, TOPOLOGY).link, AsyncMemoryLink)
    async_consumer = AsyncConsumer(memory_broker.url, TOPOLOGY, "emails", lambda body: None)
    assert type(async_consumer) is AsyncConsumer
    assert isinstance(async_consumer.feed, AsyncMemoryFeed) and async_consumer.inline
    assert type(Publisher("amqp://guest:guest@localhost/", TOPOLOGY)) is Publisher


def test_the_environment_may_name_the_memory_broker(
    memory_broker: MemoryBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DELAYQ_URL", memory_broker.url)
    memory_broker.apply(TOPOLOGY)
    receipt = Publisher(topology=TOPOLOGY).publish("hi", "email.welcome", "10m")
    assert receipt.tier == "15m"
    assert [m.body for m in memory_broker.messages("shop.tier.15m")] == [b"hi"]


def test_an_unknown_memory_broker_fails_at_construction() -> None:
    with pytest.raises(TopologyMissing, match="no memory broker named 'gone'"):
        Publisher("memory://gone", TOPOLOGY)


def test_publishing_before_the_topology_exists_fails_like_rabbitmq(
    memory_broker: MemoryBroker,
) -> None:
    publisher = memory_broker.publisher(TOPOLOGY)
    with pytest.raises(TopologyMissing):
        publisher.publish("hi", "email.welcome", "1m")
    memory_broker.apply(TOPOLOGY)
    memory_broker.delete_queue("shop.tier.5m")
    with pytest.raises(Unroutable):
        publisher.publish("hi", "email.welcome", "5m")


def test_handlers_see_virtual_time_and_retries_are_queue_addressed(
    memory_broker: MemoryBroker,
) -> None:
    emails: list[int] = []
    audit: list[int] = []

    def send(body: Any) -> None:
        emails.append(memory_broker.elapsed_ms)
        if len(emails) == 1:
            raise Retry("15m", "mail server busy")

    memory_broker.consumer(TOPOLOGY, "emails", send)
    memory_broker.consumer(TOPOLOGY, "audit", lambda body: audit.append(memory_broker.elapsed_ms))
    memory_broker.publisher(TOPOLOGY).publish({"to": "a@b.c"}, "email.welcome", "1m")

    memory_broker.advance("59s")
    assert emails == [] and audit == []
    memory_broker.advance("1s")
    assert emails == [60_000] and audit == [60_000]
    memory_broker.advance("1h")
    assert emails == [60_000, 60_000 + 900_000]
    assert audit == [60_000]  # the retry went to the failing queue alone
    assert memory_broker.now_ms - memory_broker.elapsed_ms == 1_767_225_600_000


def test_rocketmq_schedule_of_16_retries_runs_on_virtual_time(memory_broker: MemoryBroker) -> None:
    """The 16 retries of RocketMQ's preset (4 h 45 m 40 s in all) on a ladder of its delays."""
    topology = Topology(
        namespace="rocket",
        ladder=ROCKETMQ_SCHEDULE,
        destinations=[{"queue": "orders", "bindings": ["order.#"]}],
    )
    policy = ScheduleBackoff.of(ROCKETMQ_SCHEDULE)
    attempts: list[int] = []

    def always_fails(body: Any) -> None:
        attempts.append(memory_broker.elapsed_ms)
        raise ConnectionError("payment gateway down")

    consumer = memory_broker.consumer(topology, "orders", always_fails, policy=policy)
    memory_broker.publisher(topology).publish({"order": 42}, "order.pay", "0s")

    assert memory_broker.run_until_idle(max="6h")

    schedule = policy.schedule(topology.ladder)
    assert len(schedule) == 16
    expected = [0] + [int(row.cumulative.total_seconds() * 1000) for row in schedule]
    assert attempts == expected
    assert memory_broker.elapsed_ms == 17_140_000 == expected[-1]  # 4 h 45 m 40 s
    [dead] = memory_broker.dlq("orders")
    assert (dead.reason, dead.attempt, dead.error_type) == (
        "exhausted",
        17,
        "builtins.ConnectionError",
    )
    assert consumer.stats.retried == 16 and consumer.stats.dead_lettered == 1


def test_duplicates_are_skipped_with_the_store(memory_broker: MemoryBroker) -> None:
    seen: list[Any] = []
    consumer = memory_broker.consumer(TOPOLOGY, "emails", seen.append, store=InMemoryStore())
    publisher = memory_broker.publisher(TOPOLOGY)
    for delay in ("0s", "1m", "5m"):
        publisher.publish("once", "email.x", delay, message_id="m-1")
    memory_broker.advance("10m")
    assert seen == ["once"]
    assert consumer.stats.duplicates == 2


class Order(BaseModel):
    id: int


def test_async_consumers_decode_models_and_dead_letter_the_undecodable(
    memory_broker: MemoryBroker,
) -> None:
    got: list[Order] = []

    async def handle(order: Order) -> None:
        got.append(order)

    async def scenario() -> None:
        consumer = await memory_broker.async_consumer(TOPOLOGY, "emails", handle, model=Order)
        publisher = memory_broker.async_publisher(TOPOLOGY)
        await publisher.publish(Order(id=1), "email.order", "1m")
        await publisher.publish({"no": "id"}, "email.order", "1m")
        with pytest.raises(InvalidInput, match="advance_async"):
            memory_broker.advance("1m")
        await memory_broker.advance_async("1m")
        await consumer.stop()

    asyncio.run(scenario())
    assert got == [Order(id=1)]
    [dead] = memory_broker.dlq("emails")
    assert dead.reason == "undecodable"
    assert dead.headers[H_ATTEMPT] == 1


def test_async_retries_then_dlq(memory_broker: MemoryBroker) -> None:
    calls: list[int] = []

    async def flaky(body: Any) -> None:
        calls.append(memory_broker.elapsed_ms)
        raise KeyError("missing")

    async def scenario() -> None:
        await memory_broker.async_consumer(
            TOPOLOGY, "emails", flaky, policy=FixedBackoff(delay="5m", max_attempts=3)
        )
        await memory_broker.async_publisher(TOPOLOGY).publish("x", "email.x", "0s")
        assert await memory_broker.run_until_idle_async()

    asyncio.run(scenario())
    assert calls == [0, 300_000, 600_000]
    [dead] = memory_broker.dlq("emails")
    assert dead.headers[H_ERROR_TYPE] == "builtins.KeyError"


def test_publish_many_and_send_many(memory_broker: MemoryBroker) -> None:
    memory_broker.apply(TOPOLOGY)
    publisher = memory_broker.publisher(TOPOLOGY)
    receipts = publisher.publish_many(
        [Message(body=str(i), routing_key="email.x", delay=timedelta(minutes=i)) for i in range(3)]
    )
    assert [r.tier for r in receipts] == [None, "1m", "5m"]
    settled: list[tuple[int, object]] = []
    built = (publisher.factory.build(b"x", "email.x", "1h") for _ in range(2))
    publisher.send_many(built, settle=lambda i, m, e: settled.append((i, e)))
    assert settled == [(0, None), (1, None)]
    assert memory_broker.depth("shop.tier.1h") == 2


def test_a_handler_cannot_advance_the_broker(memory_broker: MemoryBroker) -> None:
    def sneaky(body: Any) -> None:
        memory_broker.advance("1m")

    consumer = memory_broker.consumer(
        TOPOLOGY, "emails", sneaky, policy=FixedBackoff(delay="1m", max_attempts=1)
    )
    memory_broker.publisher(TOPOLOGY).publish("x", "email.x", "0s")
    memory_broker.advance("0s")
    [dead] = memory_broker.dlq("emails")
    assert "already running" in (dead.error_message or "")
    assert consumer.stats.dead_lettered == 1


def test_the_exact_strategy_arrives_on_the_unit(memory_broker: MemoryBroker) -> None:
    topology = Topology.model_validate({**TOPOLOGY.model_dump(), "strategy": "exact"})
    arrivals: list[int] = []
    memory_broker.consumer(topology, "emails", lambda b: arrivals.append(memory_broker.elapsed_ms))
    receipt = memory_broker.publisher(topology).publish("x", "email.x", "1234s")
    memory_broker.run_until_idle()
    assert receipt.tier_ms == 1_234_000
    assert arrivals == [1_234_000]


def test_a_worker_runs_on_the_memory_broker(memory_broker: MemoryBroker) -> None:
    from delayq.worker import Worker

    worker = Worker(TOPOLOGY, policy=FixedBackoff(delay="1m", max_attempts=2))
    sent: list[Any] = []
    audited: list[Any] = []

    @worker.handler("emails")
    def send(body: Any) -> None:
        sent.append(body)
        raise RuntimeError("smtp down")

    @worker.handler("audit", policy=FixedBackoff(delay="5m", max_attempts=1))
    async def audit(body: Any) -> None:
        audited.append(body)

    with pytest.raises(InvalidInput, match="attach_async"):
        memory_broker.attach(worker)

    async def scenario() -> None:
        consumers = await memory_broker.attach_async(worker)
        assert [type(c) for c in consumers] == [Consumer, AsyncConsumer]
        assert [type(c.feed) for c in consumers] == [MemoryFeed, AsyncMemoryFeed]
        await memory_broker.async_publisher(TOPOLOGY).publish("hi", "email.hi", "1m")
        assert await memory_broker.run_until_idle_async()

    asyncio.run(scenario())
    assert sent == ["hi", "hi"] and audited == ["hi"]
    assert [m.reason for m in memory_broker.dlq("emails")] == ["exhausted"]


def test_a_worker_cannot_run_on_a_memory_url(memory_broker: MemoryBroker) -> None:
    from delayq.worker import Worker

    worker = Worker(TOPOLOGY)
    worker.handler("emails")(lambda body: None)
    with pytest.raises(InvalidInput, match=r"broker\.attach"):
        worker.run(memory_broker.url)


def test_a_retry_that_cannot_be_published_ends_at_the_delivery_limit(
    memory_broker: MemoryBroker,
) -> None:
    """The republish fails (its retry tier is gone): the delivery goes back to the queue,
    and the quorum queue's x-delivery-limit dead-letters it, as RabbitMQ would."""
    calls: list[int] = []

    def failing(body: Any) -> None:
        calls.append(1)
        raise RuntimeError("fails")

    consumer = memory_broker.consumer(
        TOPOLOGY, "emails", failing, policy=FixedBackoff(delay="1m", max_attempts=5)
    )
    memory_broker.delete_queue("shop.retry.1m.direct")
    memory_broker.publisher(TOPOLOGY).publish("x", "email.x", "0s")
    memory_broker.advance("0s")

    limit = TOPOLOGY.destination("emails").delivery_limit
    assert len(calls) == limit + 1 and consumer.stats.returned == limit + 1
    [dead] = memory_broker.dlq("emails")
    assert dead.headers["x-death"][0]["reason"] == "delivery_limit"
    assert dead.headers["x-first-death-queue"] == "emails"


def test_closing_the_broker_detaches_its_consumers() -> None:
    broker = MemoryBroker()
    broker.consumer(TOPOLOGY, "emails", lambda body: None)
    broker.close()
    assert broker._dispatch.subscribers == []


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_keys_are_forgotten_after_the_retention_on_virtual_time(
    memory_broker: MemoryBroker, kind: str
) -> None:
    seen: list[int] = []

    def handler(body: Any) -> None:
        seen.append(memory_broker.elapsed_ms)

    async def async_handler(body: Any) -> None:
        handler(body)

    # Dedup retention under test; nothing is cancelled (the mark check would want days).
    options: dict[str, Any] = {
        "store": InMemoryStore(),
        "retention": "1h",
        "check_retention": False,
    }

    async def scenario() -> None:
        if kind == "sync":
            memory_broker.consumer(TOPOLOGY, "emails", handler, **options)
        else:
            await memory_broker.async_consumer(TOPOLOGY, "emails", async_handler, **options)
        publisher = memory_broker.publisher(TOPOLOGY)
        publisher.publish("x", "email.x", "0s", message_id="same")
        publisher.publish("x", "email.x", "15m", message_id="same")  # within retention
        await memory_broker.advance_async("5m")
        publisher.publish("x", "email.x", "1h", message_id="same")  # past it
        await memory_broker.advance_async("2h")

    asyncio.run(scenario())
    assert seen == [0, 3_900_000]


def test_exact_retries_are_addressed_to_the_failing_queue(memory_broker: MemoryBroker) -> None:
    topology = Topology.model_validate({**TOPOLOGY.model_dump(), "strategy": "exact"})
    emails: list[int] = []
    audit: list[int] = []

    def flaky(body: Any) -> None:
        emails.append(memory_broker.elapsed_ms)
        if len(emails) == 1:
            raise Retry("90s")

    memory_broker.consumer(topology, "emails", flaky)
    memory_broker.consumer(topology, "audit", lambda b: audit.append(memory_broker.elapsed_ms))
    memory_broker.publisher(topology).publish("x", "email.x", "7s")
    assert memory_broker.run_until_idle()
    assert emails == [7_000, 97_000]
    assert audit == [7_000]


def test_parked_messages_can_be_replayed(memory_broker: MemoryBroker) -> None:
    emails = {"queue": "emails", "bindings": ["email.*"]}
    # lost.* is bound later, outside this topology: its key is accepted at publish
    topology = Topology(
        namespace="park", ladder=["1m"], destinations=[emails], external_bindings=["lost.*"]
    )
    fail = [True]
    seen: list[Any] = []

    def handler(body: Any) -> None:
        seen.append(body)
        if fail[0]:
            raise ValueError("not yet")

    memory_broker.consumer(topology, "emails", handler, policy=FixedBackoff(max_attempts=1))
    publisher = memory_broker.publisher(topology)
    publisher.publish("a", "email.a", "0s")
    lost = publisher.publish("b", "lost.key", "1m")
    memory_broker.advance("1m")
    assert [m.reason for m in memory_broker.dlq("emails")] == ["exhausted"]
    assert [m.message_id for m in memory_broker.unrouted(topology)] == [lost.message_id]

    fail[0] = False
    assert len(memory_broker.replay_dlq("emails")) == 1
    memory_broker.advance("0s")
    assert seen == ["a", "a"] and memory_broker.dlq("emails") == []

    lost_queue = {"queue": "lost", "bindings": ["lost.*"]}
    memory_broker.apply(
        Topology(namespace="park", ladder=["1m"], destinations=[emails, lost_queue])
    )
    assert memory_broker.replay_unrouted(topology) == [lost.message_id]
    [found] = memory_broker.messages("lost")
    assert found.body == b"b" and found.attempt == 1


def test_injected_publish_failures(memory_broker: MemoryBroker) -> None:
    from delayq.errors import PublishRejected, PublishUnconfirmed

    calls: list[int] = []

    def flaky(body: Any) -> None:
        calls.append(memory_broker.elapsed_ms)
        if len(calls) < 3:
            raise RuntimeError("try again")

    consumer = memory_broker.consumer(
        TOPOLOGY, "emails", flaky, policy=FixedBackoff(delay="1m", max_attempts=5)
    )
    publisher = memory_broker.publisher(TOPOLOGY)
    memory_broker.fail_publishes(kind="unconfirmed")
    with pytest.raises(PublishUnconfirmed):
        publisher.publish("x", "email.x", "0s")
    memory_broker.fail_publishes(exchange="shop.tier.1m")
    publisher.publish("x", "email.x", "0s")  # not to that exchange: goes through
    with pytest.raises(PublishRejected):
        publisher.publish("x", "email.x", "1m")

    memory_broker.fail_publishes(exchange="shop.retry.1m.direct")  # the first retry is nacked
    memory_broker.advance("5m")
    # Returned to the queue and handled again at once; then retried after 1 m.
    assert calls == [0, 0, 60_000]
    assert consumer.stats.returned == 1 and consumer.stats.retried == 1
    with pytest.raises(InvalidInput):
        memory_broker.fail_publishes(kind="lost")


def test_a_closed_broker_takes_no_more_messages() -> None:
    from delayq.errors import ConnectionFailed

    broker = MemoryBroker()
    broker.apply(TOPOLOGY)
    publisher = broker.publisher(TOPOLOGY)
    broker.close()
    with pytest.raises(ConnectionFailed, match="closed"):
        publisher.publish("x", "email.x", "1m")
    with pytest.raises(TopologyMissing, match="no memory broker"):
        publisher.connect()
