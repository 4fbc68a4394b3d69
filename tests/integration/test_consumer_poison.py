"""No header value stops a consumer: the sync and asyncio consumers fed every AMQP field
type and value (tests/integration/test_intake_poison.py's raw bytes) in a header of the
publisher's own, between good messages published straight into their queue.

Every good message is handled once; every poison one is handled, or dead-lettered with
a reason, or (headers the client cannot read) rejected by the consumer and dead-lettered
intact by the broker to the queue's DLQ; the consumer never loses its connection for it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pika

from delayq.stores.memory import InMemoryStore
from delayq.sync import apply_topology
from tests.amqp import depth
from tests.integration.test_intake_poison import VALUES, RawHeaders, _pair
from tests.waiting import wait_for


def test_no_header_value_stops_a_consumer_and_the_good_messages_around_it_are_handled_once(
    make_topology: Any, rabbitmq_url: str, start_consumer: Any
) -> None:
    topology = make_topology(["1s"])
    queue = f"{topology.namespace}.work"
    apply_topology(topology, rabbitmq_url)
    handled: Counter[bytes] = Counter()

    def handler(body: Any) -> None:
        handled[body if isinstance(body, bytes) else str(body).encode()] += 1

    consumer = start_consumer(topology, queue, handler, store=InMemoryStore(), prefetch=50)
    refused: list[str] = []
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        plain = pika.BasicProperties(content_type="application/octet-stream")
        for n in range(200):
            channel.basic_publish("", queue, f"good {n}".encode(), plain)
        for name, raw in VALUES.items():
            props = RawHeaders(_pair(b"o", raw), content_type="application/octet-stream")
            try:
                channel.basic_publish("", queue, f"poison {name}".encode(), props)
            except pika.exceptions.AMQPError:  # the broker refused it: never entered
                refused.append(name)
                connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
                channel = connection.channel()
                channel.confirm_delivery()
        props = RawHeaders(_pair(b"\xff", b"t\x01"), content_type="application/octet-stream")
        channel.basic_publish("", queue, b"poison key-not-utf8", props)
        for n in range(200, 400):
            channel.basic_publish("", queue, f"good {n}".encode(), plain)
    finally:
        if connection.is_open:
            connection.close()
    poison = len(VALUES) - len(refused) + 1
    dlq = f"{queue}.dlq"

    def accounted() -> int:
        return sum(handled.values()) + depth(rabbitmq_url, dlq)

    wait_for(
        lambda: accounted() >= 400 + poison and depth(rabbitmq_url, queue) == 0,
        60,
        lambda: f"{sum(handled.values())} handled, {depth(rabbitmq_url, dlq)} in the DLQ",
    )
    goods = {body: n for body, n in handled.items() if body.startswith(b"good")}
    assert goods == {f"good {n}".encode(): 1 for n in range(400)}
    assert all(n == 1 for n in handled.values())
    assert consumer.stats.reconnects == 0
