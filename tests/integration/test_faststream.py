"""FastStream's only delay, and the same through delayq's ``DelayqBroker``, on a real
broker. ag2ai/faststream #1668: FastStream's delay is the plugin's
``x-delayed-message`` exchange; a broker without the plugin (every server CI runs: RabbitMQ
4.3 cannot have it) refuses to declare it, so the app cannot start. Through delayq the same
``x-delay`` header waits in a tier; a subscriber on a queue delayq owns gets its retries."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from typing import Any

import pika
import pytest
from faststream.rabbit import (
    ExchangeType,
    RabbitBroker,
    RabbitExchange,
    RabbitQueue,
    RabbitRouter,
    TestRabbitBroker,
)
from faststream.rabbit.annotations import RabbitMessage

from delayq import DelayTooLong, ExponentialBackoff, InvalidDelay, InvalidInput, Topology
from delayq.integrations.faststream import DelayqBroker
from tests.waiting import first_message

SHORT_MS, LONG_MS = 1_000, 4_000


def test_faststreams_delay_needs_the_plugin_the_broker_has_not(
    rabbitmq_url: str, names: Callable[[str], str]
) -> None:
    """#1668 reproduced: FastStream's documented delay cannot start on these brokers."""
    broker = RabbitBroker(rabbitmq_url)
    delayed = RabbitExchange(
        names("x"), type=ExchangeType.X_DELAYED_MESSAGE, arguments={"x-delayed-type": "direct"}
    )

    @broker.subscriber(names("q"), exchange=delayed)
    async def task(body: str) -> None:
        raise AssertionError("ran")

    async def main() -> None:
        try:
            await broker.start()
        finally:
            await broker.stop()

    with pytest.raises(Exception, match=r"(?i)exchange type|invalid|command"):
        asyncio.run(main())


async def _run(broker: RabbitBroker, main: Callable[[], Any]) -> Any:
    await broker.start()
    try:
        return await main()
    finally:
        await broker.stop()


def test_through_delayq_each_x_delay_waits_its_own_tier(
    rabbitmq_url: str, names: Callable[[str], str], make_topology: Callable[..., Topology]
) -> None:
    topology = make_topology(ladder=["1s", "4s"], destinations=[])
    broker = DelayqBroker(rabbitmq_url, topology=topology)
    queue = names("q")
    ran: dict[str, float] = {}
    seen: dict[str, Any] = {}
    done = asyncio.Event()

    @broker.subscriber(queue)
    async def task(body: dict[str, Any], message: RabbitMessage) -> None:
        ran[body["tag"]] = time.monotonic()
        seen[body["tag"]] = (message.correlation_id, message.content_type, message.headers)
        if len(ran) == 3:
            done.set()

    async def main() -> float:
        started = time.monotonic()
        for tag, delay in (("long", LONG_MS), ("short", SHORT_MS), ("now", 0)):
            await broker.publish(
                {"tag": tag}, queue, headers={"x-delay": delay, "tenant": "t1"},
                correlation_id=f"c-{tag}",
            )  # fmt: skip
        await asyncio.wait_for(done.wait(), 60)
        return started

    started = asyncio.run(_run(broker, main))
    at = {tag: t - started for tag, t in ran.items()}
    assert at["now"] < SHORT_MS / 1000, at
    assert SHORT_MS / 1000 - 0.1 <= at["short"] < LONG_MS / 1000 - 1, at
    assert at["long"] >= LONG_MS / 1000 - 0.1, at
    for tag in ("long", "short", "now"):
        correlation_id, content_type, headers = seen[tag]
        assert correlation_id == f"c-{tag}" and content_type == "application/json"
        assert headers["tenant"] == "t1" and "x-delay" not in headers


def test_a_queue_delayq_owns_gets_its_retries_then_its_dlq(
    rabbitmq_url: str, names: Callable[[str], str], make_topology: Callable[..., Topology]
) -> None:
    queue = names("q")
    topology = make_topology(ladder=["1s"], destinations=[{"queue": queue, "bindings": [queue]}])
    policy = ExponentialBackoff(initial="1s", max_delay="1s", max_attempts=3)
    broker = DelayqBroker(rabbitmq_url, topology=topology, retry=policy)
    attempts: list[float] = []
    third = asyncio.Event()

    @broker.subscriber(RabbitQueue(queue, declare=False))
    async def flaky(body: str) -> None:
        attempts.append(time.monotonic())
        if len(attempts) == 3:
            third.set()
        raise RuntimeError(f"attempt {len(attempts)} failed")

    async def main() -> None:
        await broker.publish("job", queue, headers={"x-delay": 1000}, correlation_id="keep")
        await asyncio.wait_for(third.wait(), 60)

    asyncio.run(_run(broker, main))
    assert len(attempts) == 3
    assert all(b - a >= 0.9 for a, b in itertools.pairwise(attempts)), attempts
    method, properties, body = first_message(rabbitmq_url, f"{queue}.dlq")
    assert method is not None, "nothing dead-lettered"
    assert body == b"job" and properties.correlation_id == "keep"
    assert "attempt 3 failed" in str(properties.headers)


def test_misuse_is_refused_and_nothing_is_sent(
    rabbitmq_url: str, names: Callable[[str], str], make_topology: Callable[..., Topology]
) -> None:
    queue = names("q")
    by_headers = RabbitExchange(names("hdr"), type=ExchangeType.HEADERS)
    owned = names("owned")
    topology = make_topology(ladder=["1s"], destinations=[{"queue": owned, "bindings": [owned]}])
    broker = DelayqBroker(rabbitmq_url, topology=topology)

    @broker.subscriber(queue)
    async def never(body: str) -> None:
        raise AssertionError("ran")

    async def main() -> list[BaseException]:
        caught: list[BaseException] = []
        bad: list[dict[str, Any]] = [
            {"headers": {"x-delay": "soon"}}, {"headers": {"x-delay": float("nan")}},
            {"headers": {"x-delay": True}}, {"headers": {"x-delay": 2**63 - 1}},
            {"headers": {"x-delay": 10**30}}, {"headers": {"x-delay": 1000}, "expiration": 5},
            {"headers": {"x-delay": 1000}, "exchange": by_headers},
        ]  # fmt: skip
        for kwargs in bad:
            try:
                await broker.publish("x", queue, **kwargs)
            except Exception as exc:
                caught.append(exc)
        return caught

    caught = asyncio.run(_run(broker, main))
    kinds = [type(e) for e in caught]
    assert kinds == [InvalidDelay] * 3 + [DelayTooLong] * 2 + [InvalidInput] * 2, caught
    channel = pika.BlockingConnection(pika.URLParameters(rabbitmq_url)).channel()
    assert channel.queue_declare(queue, passive=True).method.message_count == 0
    tier = channel.queue_declare(topology.tier_name(topology.ladder.tiers[0]), passive=True)
    assert tier.method.message_count == 0
    channel.connection.close()

    declaring = DelayqBroker(rabbitmq_url, topology=topology)

    @declaring.subscriber(owned)  # FastStream would declare delayq's queue its own way
    async def wrong(body: str) -> None:
        raise AssertionError("ran")

    with pytest.raises(InvalidInput, match="declare=False"):
        asyncio.run(_run(declaring, lambda: asyncio.sleep(0)))


def test_a_delayed_message_reaches_the_queues_its_own_exchange_routes_it_to(
    rabbitmq_url: str, names: Callable[[str], str], make_topology: Callable[..., Topology]
) -> None:
    """As without a delay: a wildcard subscriber of another exchange gets no copy; a queue
    on the default exchange is reached by its name, whatever its routing key; a router's
    prefix, a subscriber started after the broker and ``apply=False`` all bind."""
    topology = make_topology(ladder=["1s"], destinations=[])
    asyncio.run(_run(DelayqBroker(rabbitmq_url, topology=topology), lambda: asyncio.sleep(0)))
    broker = DelayqBroker(rabbitmq_url, topology=topology, apply=False)
    events = RabbitExchange(names("events"), type=ExchangeType.TOPIC)
    dotted = RabbitExchange(names("dx"), type=ExchangeType.DIRECT)  # "t<hex>.dx"
    colon = RabbitExchange(dotted.name.replace(".", ":"), type=ExchangeType.DIRECT)
    by_dot, by_colon = names("bydot"), names("bycolon")
    plain, keyed, late, audit_q = names("plain"), names("keyed"), names("late"), names("audit")
    router = RabbitRouter(prefix="p-")
    got: dict[str, list[str]] = {}
    done = asyncio.Event()

    def record(where: str, body: str) -> None:
        got.setdefault(where, []).append(body)
        if sum(map(len, got.values())) >= 6:
            done.set()

    @broker.subscriber(plain)
    async def on_plain(body: str) -> None:
        record("plain", body)

    @broker.subscriber(RabbitQueue(keyed, routing_key="rk"))
    async def on_keyed(body: str) -> None:
        record("keyed", body)

    @broker.subscriber(RabbitQueue(audit_q, routing_key="#"), events)
    async def on_audit(body: str) -> None:
        record("audit", body)

    @broker.subscriber(RabbitQueue(by_dot, routing_key="k"), dotted)
    async def on_dot(body: str) -> None:
        record("dot", body)

    @broker.subscriber(RabbitQueue(by_colon, routing_key="k"), colon)
    async def on_colon(body: str) -> None:
        record("colon", body)

    @router.subscriber(plain)  # the queue p-<plain>
    async def on_prefixed(body: str) -> None:
        record("prefixed", body)

    broker.include_router(router)

    async def main() -> None:
        dynamic = broker.subscriber(late)
        dynamic(lambda body: record("late", body))
        await dynamic.start()  # after the broker started
        delay = {"x-delay": 500}
        await broker.publish("to-plain", plain, headers=delay)
        await broker.publish("to-keyed", keyed, headers=delay)
        await broker.publish("to-events", "order.paid", exchange=events, headers=delay)
        await broker.publish("to-prefixed", f"p-{plain}", headers=delay)
        await broker.publish("to-late", late, headers=delay)
        await broker.publish("to-dot", "k", exchange=dotted, headers=delay)  # not to colon
        await asyncio.wait_for(done.wait(), 30)
        await asyncio.sleep(1.5)  # a copy would be due by now

    try:
        asyncio.run(_run(broker, main))
    finally:
        connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
        connection.channel().exchange_delete(colon.name)
        connection.close()
    assert got == {
        "plain": ["to-plain"], "keyed": ["to-keyed"], "audit": ["to-events"],
        "prefixed": ["to-prefixed"], "late": ["to-late"], "dot": ["to-dot"],
    }, got  # fmt: skip


def test_a_handler_that_settled_its_message_itself_is_not_retried(
    rabbitmq_url: str, names: Callable[[str], str], make_topology: Callable[..., Topology]
) -> None:
    queue = names("q")
    topology = make_topology(ladder=["1s"], destinations=[{"queue": queue, "bindings": [queue]}])
    broker = DelayqBroker(rabbitmq_url, topology=topology)
    runs: list[str] = []
    both = asyncio.Event()

    @broker.subscriber(RabbitQueue(queue, declare=False))
    async def settles(body: str, message: RabbitMessage) -> None:
        runs.append(body)
        await (message.ack() if body == "ack" else message.reject())
        if len(runs) == 2:
            both.set()
        raise RuntimeError("after settling")

    async def main() -> None:
        await broker.publish("ack", queue)
        await broker.publish("reject", queue)
        await asyncio.wait_for(both.wait(), 30)
        await asyncio.sleep(1.5)  # a retry would be due by now

    asyncio.run(_run(broker, main))
    assert sorted(runs) == ["ack", "reject"], runs
    _method, _properties, body = first_message(rabbitmq_url, f"{queue}.dlq")
    assert body == b"reject"  # the broker's dead letter of the rejected one
    method, _properties, body = first_message(rabbitmq_url, f"{queue}.dlq", timeout_s=1)
    assert method is None, body  # once, and none of delayq's


def test_connection_arguments_beside_the_url_and_a_wrong_topology_are_refused(
    rabbitmq_url: str,
) -> None:
    topology = Topology(namespace="never")
    for kwargs in ({"host": "127.0.0.1"}, {"port": 5673}, {"virtualhost": "/x"}):
        with pytest.raises(InvalidInput, match="URL"):
            DelayqBroker(rabbitmq_url, topology=topology, **kwargs)
    with pytest.raises(InvalidInput, match="Topology"):
        DelayqBroker(rabbitmq_url, topology="never")  # type: ignore[arg-type]


def test_faststreams_test_client_delivers_a_delayed_publish_at_once() -> None:
    """``TestRabbitBroker`` needs no broker: the delay is not kept (as with no plugin)."""
    broker = DelayqBroker("amqp://127.0.0.1:1/", topology=Topology(namespace="memory"))
    got: list[str] = []

    @broker.subscriber("jobs")
    async def job(body: str) -> None:
        got.append(body)

    async def main() -> None:
        async with TestRabbitBroker(broker) as test:
            await test.publish("now", "jobs", headers={"x-delay": 60_000})

    asyncio.run(main())
    assert got == ["now"]
