"""The frame feed (``AsyncConsumer``'s deliveries read from AMQP frames) against a real broker.

It must hand over exactly what the aio-pika feed hands over (every property and
header type a producer may send, bodies of any size), report a lost connection,
a closed channel or a consumer the broker cancelled, and never settle a delivery
of an earlier connection on a later one.
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import threading
from collections.abc import Callable
from typing import Any

import aio_pika
import pika
import pytest

from delayq import Topology
from delayq.aio import AsyncConsumer
from delayq.aio._feed import AioPikaFeed
from delayq.aio._framefeed import FrameDelivery, FrameFeed
from delayq.consume.delivery import Delivery
from delayq.errors import ConnectionFailed, TopologyMissing
from delayq.links import FeedLost, open_async_feed
from delayq.local.node import LocalNode
from delayq.message.decoding import basic_properties
from delayq.sync import apply_topology
from delayq.sync._feed import PikaFeed
from tests.waiting import wait_for, wait_for_async


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def raw_channel(url: str) -> tuple[Any, Any]:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    return connection, connection.channel()


# The message with a priority first: RabbitMQ 4.3's quorum queues deliver by priority (4.0's
# by arrival for priorities up to 4), so only this order is the same on every server.
PROPERTIES: list[dict[str, Any]] = [
    {
        "content_type": "application/json",
        "content_encoding": "utf-8",
        "headers": {
            "s": "text ünï",
            "i": 7,
            "neg": -(2**40),
            "f": 1.5,
            "t": True,
            "none": None,
            "nested": {"list": [1, "a", {"deep": False}], "empty": {}},
            "when": datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
            "dec": decimal.Decimal("12.34"),
            "raw": bytearray(b"\xff\xfe not utf-8"),
        },
        "delivery_mode": 2,
        "priority": 3,
        "correlation_id": "corr",
        "reply_to": "reply",
        "expiration": 600_000,  # read as a property, never reached (4.3 expires sooner)
        "message_id": "mid-1",
        "timestamp": datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC),
        "type": "kind",
        "user_id": "guest",
        "app_id": "app",
    },
    {},  # nothing at all: no message id, no content type, no headers
    {"message_id": "m" * 255, "headers": {"x-death": [{"count": 2, "queue": "q"}]}},
]
BODIES = [b"", b"{}", bytes(range(256)) * 2000]  # 512 KB: several frames of 128 KB


async def drain(feed: Any, topo: Topology, queue: str, want: int) -> list[Delivery]:
    got: list[Delivery] = []
    lost: list[BaseException] = []

    async def on_delivery(message: Any, delivery: Delivery) -> None:
        got.append(delivery)
        await message.ack()

    await feed.open(topo, queue, 10, on_delivery, lost.append)
    try:
        await wait_for_async(lambda: len(got) >= want, 30, lambda: f"{want} deliveries, {len(got)}")
        await feed.unsubscribe()
        assert not feed.consuming and not lost
    finally:
        await feed.close()
    return got


def test_the_frame_feed_hands_over_what_the_aio_pika_feed_does(
    rabbitmq_url: str, make_topology: Callable[..., Topology]
) -> None:
    topo = make_topology(["1s"])
    apply_topology(topo, rabbitmq_url)
    queues = [f"{topo.namespace}.frames", f"{topo.namespace}.pika"]
    _fill(rabbitmq_url, queues)
    want = len(PROPERTIES) * len(BODIES)
    try:
        frames = run(drain(FrameFeed(rabbitmq_url), topo, queues[0], want))
        pika_ = run(drain(AioPikaFeed(rabbitmq_url), topo, queues[1], want))
    finally:
        _remove(rabbitmq_url, queues)

    def comparable(d: Delivery) -> tuple[Any, ...]:
        headers = {k: v for k, v in d.headers.items() if k != "x-delivery-count"}
        # The routing key is each queue's name; aio-pika makes up an id where none is given.
        return (d.body, d.content_type, headers, d.redelivered)

    assert [comparable(d) for d in frames] == [comparable(d) for d in pika_]
    assert [d.routing_key for d in frames] == [queues[0]] * len(frames)
    ids = [d.message_id for d in frames]
    assert ids[:3] == ["mid-1"] * 3 and ids[6:] == ["m" * 255] * 3
    assert [len(d.body) for d in frames] == [len(b) for _ in PROPERTIES for b in BODIES]
    assert frames[0].headers["nested"] == {"list": [1, "a", {"deep": False}], "empty": {}}
    assert frames[0].headers["raw"] == bytearray(b"\xff\xfe not utf-8")
    assert frames[0].headers["f"] == 1.5 and frames[0].headers["dec"] == decimal.Decimal("12.34")


def _fill(url: str, queues: list[str]) -> None:
    async def fill() -> None:  # aio-pika encodes every field type (pika refuses floats)
        connection = await aio_pika.connect(url)
        async with connection:
            channel = await connection.channel()
            for queue in queues:
                await channel.declare_queue(
                    queue, durable=True, arguments={"x-queue-type": "quorum"}
                )
                for props in PROPERTIES:
                    for body in BODIES:
                        message = aio_pika.Message(body, **props)
                        await channel.default_exchange.publish(message, routing_key=queue)

    run(fill())


def _remove(url: str, queues: list[str]) -> None:
    connection, channel = raw_channel(url)
    try:
        for queue in queues:
            channel.queue_delete(queue)
    finally:
        connection.close()


def _drain_sync(feed: PikaFeed, topo: Topology, queue: str, want: int) -> list[Delivery]:
    got: list[Delivery] = []

    def on_delivery(settler: Any, delivery: Delivery) -> None:
        got.append(delivery)
        settler.ack()

    feed.open(topo, queue, 10, on_delivery)
    try:

        def arrived() -> bool:
            feed.pump(0.05)
            return len(got) >= want

        wait_for(arrived, 30, lambda: f"{len(got)} of {want}")
        feed.flush()
        feed.unsubscribe()
    finally:
        feed.close()
    return got


def _pika_gets(url: str, queue: str, want: int) -> list[Any]:
    """What a raw pika consumer gets: each message's properties, decoded by pika."""
    connection, channel = raw_channel(url)
    got: list[Any] = []
    try:
        wait_for(
            lambda: _got_one(channel, queue, got) or len(got) >= want,
            30,
            lambda: f"{len(got)} of {want} by basic_get",
        )
    finally:
        connection.close()
    return got


def _got_one(channel: Any, queue: str, got: list[Any]) -> bool:
    method, props, _ = channel.basic_get(queue, auto_ack=True)
    if method is not None:
        got.append(props)
    return False


def _typed(value: Any) -> Any:
    """``value`` with each part's type beside it: pika's ``long`` is not an ``int``."""
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return (type(value).__name__, value)


def test_the_sync_feed_reads_headers_as_pika_does_with_delayqs_decoder(
    rabbitmq_url: str, make_topology: Callable[..., Topology], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sync consumer's connection reads content headers with delayq's decoder
    (``delayq.sync._connection.read_content_headers``): every property and header value,
    of every type, as pika's own decoding gives it to a raw pika consumer (a float or a
    decimal, which pika reads its own way, left to pika)."""
    decoded: list[int] = []
    real = basic_properties

    def counted(data: bytes, offset: int, end: int, table: Any = None) -> dict[str, Any]:
        decoded.append(end)
        return real(data, offset, end, table)

    monkeypatch.setattr("delayq.sync._connection.basic_properties", counted)
    topo = make_topology(["1s"])
    apply_topology(topo, rabbitmq_url)
    queues = [f"{topo.namespace}.sync", f"{topo.namespace}.pika"]
    _fill(rabbitmq_url, queues)
    want = len(PROPERTIES) * len(BODIES)
    try:
        synced = _drain_sync(PikaFeed(rabbitmq_url), topo, queues[0], want)
        raw = _pika_gets(rabbitmq_url, queues[1], want)
    finally:
        _remove(rabbitmq_url, queues)

    def without_count(headers: Any) -> Any:
        return {k: v for k, v in (headers or {}).items() if k != "x-delivery-count"}

    assert [_typed(without_count(d.headers)) for d in synced] == [
        _typed(without_count(p.headers)) for p in raw
    ]
    assert [d.content_type for d in synced] == [p.content_type for p in raw]
    given = [*range(3), *range(6, 9)]  # the middle three get ids aio-pika makes up
    assert [synced[i].message_id for i in given] == [raw[i].message_id for i in given]
    assert type(synced[6].headers["x-death"][0]["count"]) is type(
        raw[6].headers["x-death"][0]["count"]
    )
    # PROPERTIES[0] carries a float and a decimal: pika reads those headers itself
    assert len(decoded) >= want - len(BODIES)


def test_amqp_urls_get_the_frame_feed() -> None:
    assert isinstance(open_async_feed("amqp://guest:guest@localhost/"), FrameFeed)
    assert isinstance(open_async_feed("amqps://guest:guest@localhost/"), FrameFeed)


def test_a_deleted_queue_is_a_lost_feed_and_its_depth_cannot_be_read(
    rabbitmq_url: str, make_topology: Callable[..., Topology]
) -> None:
    topo = make_topology(["1s"])
    apply_topology(topo, rabbitmq_url)
    queue = f"{topo.namespace}.work"

    async def scenario() -> None:
        feed, lost, acked = FrameFeed(rabbitmq_url), [], []

        async def on_delivery(message: Any, delivery: Delivery) -> None:
            await message.ack()
            acked.append(delivery)

        await feed.open(topo, queue, 5, on_delivery, lost.append)
        try:
            connection, channel = raw_channel(rabbitmq_url)
            channel.basic_publish("", queue, b"x")
            await wait_for_async(lambda: acked, 10, "the message delivered")
            channel.queue_delete(queue)
            connection.close()
            await wait_for_async(lambda: lost, 10, "the broker's cancel reported")
            assert "cancelled the consumer" in str(lost[0])
            with pytest.raises(FeedLost, match="404"):
                await feed.ready()
        finally:
            await feed.close()

    run(scenario())


def test_a_feed_opened_on_a_missing_queue_or_without_the_right_to_read_says_so(
    rabbitmq_url: str, make_topology: Callable[..., Topology]
) -> None:
    topo = make_topology(["1s"])
    apply_topology(topo, rabbitmq_url)

    async def nothing(message: Any, delivery: Delivery) -> None:
        raise AssertionError("nothing is delivered")

    async def scenario() -> None:
        feed = FrameFeed(rabbitmq_url)
        with pytest.raises(TopologyMissing, match="no-such-queue"):
            await feed.open(topo, f"{topo.namespace}.no-such-queue", 5, nothing, print)
        assert not feed.consuming
        with pytest.raises(ConnectionFailed):
            await FrameFeed("amqp://guest:wrong@127.0.0.1:1/").open(topo, "q", 5, nothing, print)

    run(scenario())  # a refusal to read (AccessRefused): tests/integration/test_grant.py


def test_a_delivery_of_a_lost_connection_is_never_settled_on_the_next(
    local_rabbitmq_node: LocalNode, make_topology: Callable[..., Topology]
) -> None:
    url = local_rabbitmq_node.url
    topo = make_topology(["1s"])
    apply_topology(topo, url)
    queue = f"{topo.namespace}.work"
    connection, channel = raw_channel(url)
    for n in range(3):
        channel.basic_publish("", queue, b"{}", pika.BasicProperties(message_id=f"m{n}"))
    connection.close()

    async def scenario() -> None:
        feed, held, lost = FrameFeed(url), [], []

        async def hold(message: Any, delivery: Delivery) -> None:
            held.append(message)  # never settled before the connection goes

        await feed.open(topo, queue, 10, hold, lost.append)
        await wait_for_async(lambda: len(held) == 3, 10, "3 deliveries held")
        await asyncio.to_thread(
            local_rabbitmq_node.ctl, "close_all_connections", "frame feed test", check=False
        )
        await wait_for_async(lambda: lost, 10, "the lost connection reported")
        await feed.close()
        again: list[FrameDelivery] = []

        async def settle(message: Any, delivery: Delivery) -> None:
            again.append(message)
            await message.ack()

        await feed.open(topo, queue, 10, settle, lost.append)
        try:
            await wait_for_async(lambda: len(again) == 3, 10, "3 redeliveries")
            with pytest.raises(Exception, match=r"(?i)connection"):
                await held[0].ack(multiple=True)  # its channel is gone: never on the new one
            assert await feed.ready() == 0 and len(lost) == 1
        finally:
            await feed.close()

    run(scenario())


def test_the_consumer_survives_connections_closed_under_it(
    local_rabbitmq_node: LocalNode, make_topology: Callable[..., Topology]
) -> None:
    url = local_rabbitmq_node.url
    topo = make_topology(["1s"])
    apply_topology(topo, url)
    queue = f"{topo.namespace}.work"
    connection, channel = raw_channel(url)
    for n in range(2000):
        channel.basic_publish(
            "",
            queue,
            b'{"n": %d}' % n,
            pika.BasicProperties(message_id=f"m{n}", content_type="application/json"),
        )
    connection.close()
    seen: list[int] = []
    closers: list[threading.Thread] = []

    async def scenario() -> None:
        async def handler(body: Any) -> None:
            seen.append(body["n"])
            if len(seen) in (300, 1200):  # mid-stream, twice
                closer = threading.Thread(
                    target=local_rabbitmq_node.ctl,
                    args=("close_all_connections", "frame feed test"),
                    kwargs={"check": False},
                )
                closers.append(closer)
                closer.start()

        consumer = AsyncConsumer(url, topo, queue, handler)
        assert isinstance(consumer.feed, FrameFeed)
        await consumer.start()
        try:
            await wait_for_async(
                lambda: set(seen) == set(range(2000)), 60, lambda: f"2000 handled, {len(set(seen))}"
            )
            # Both closes done before the test ends (the node serves the next test too).
            await wait_for_async(lambda: not any(c.is_alive() for c in closers), 60, "the closes")
            await wait_for_async(lambda: consumer.stats.reconnects >= 1, 30, "a reconnect")
        finally:
            await consumer.stop()
            for closer in closers:
                closer.join()

    run(scenario())
