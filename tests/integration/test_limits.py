"""Message limits against a real broker: why they exist, and that a message at the
limits travels through retries to the dead-letter queue without a failed republish."""

from __future__ import annotations

import time
from typing import Any

import pika
import pika.exceptions as pex
import pytest

from delayq import FixedBackoff, HeadersTooLarge
from delayq.consume.delivery import H_DEAD_LETTER_REASON, H_ERROR_MESSAGE, H_ERROR_TRACE
from delayq.message.envelope import H_ATTEMPT
from delayq.message.limits import DELAYQ_RESERVED_BYTES, FRAME_MAX
from delayq.message.validate import headers_size
from delayq.sync import apply_topology
from tests.waiting import wait_for


def filler(budget: int) -> dict[str, str]:
    """User headers whose AMQP encoding takes exactly ``budget`` bytes."""
    headers = {"filler": "v" * (budget - 4 - 1 - len("filler") - 1 - 4)}
    assert headers_size(headers) == budget
    return headers


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def test_the_broker_closes_the_connection_on_headers_larger_than_a_frame(
    rabbitmq_url: str,
) -> None:
    """Why the header limit exists: raw pika, no delayq."""
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        channel = connection.channel()
        properties = pika.BasicProperties(headers=filler(FRAME_MAX + 1024))
        channel.basic_publish("", "no-such-queue", b"x", properties)
        with pytest.raises(pex.ConnectionClosedByBroker, match="frame_too_large"):
            connection.process_data_events(time_limit=2.0)
    finally:
        if connection.is_open:
            connection.close()


def test_a_message_at_the_header_limit_is_retried_and_dead_lettered(
    make_topology: Any, rabbitmq_url: str, collect: Any, start_consumer: Any, driver: Any
) -> None:
    most = FRAME_MAX - DELAYQ_RESERVED_BYTES
    topo = make_topology(["1s"], limits={"max_header_bytes": most})
    queue = f"{topo.namespace}.work"
    apply_topology(topo, rabbitmq_url)
    dlq = collect(f"{queue}.dlq")
    with pytest.raises(HeadersTooLarge):
        driver.publish(topo, b"x", "job.big", "0s", headers=filler(most + 1))
    attempts: list[float] = []

    def handler(_: Any) -> None:
        attempts.append(time.monotonic())
        raise ValueError("e" * 100_000)  # bounded to 1 KiB in the headers, the trace to 8 KiB

    consumer = start_consumer(topo, queue, handler, policy=FixedBackoff(delay="1s", max_attempts=2))
    driver.publish(
        topo, b"body", "job." + "k" * 250, "0s", message_id="m" * 255, headers=filler(most)
    )
    [dead] = dlq.wait(1, timeout_s=20)
    assert len(attempts) == 2
    # The collector sees the dead letter before the consumer has its confirm (and counts it).
    stats = consumer.stats
    wait_for(lambda: stats.dead_lettered == 1, 10, lambda: f"the dead letter counted ({stats})")
    assert stats.retried == 1 and stats.dead_lettered == 1
    assert dead.message_id == "m" * 255
    assert dead.headers["filler"] == filler(most)["filler"]
    assert dead.headers[H_ATTEMPT] == 2
    assert text(dead.headers[H_DEAD_LETTER_REASON]) == "exhausted"
    assert len(text(dead.headers[H_ERROR_MESSAGE]).encode()) <= 1024
    assert H_ERROR_TRACE in dead.headers


def test_the_body_limit_is_what_rabbitmq_4_refuses_and_3_10_takes(
    make_topology: Any, rabbitmq_url: str, rabbitmq_version: tuple[int, ...]
) -> None:
    """``max_message_size``: 128 MiB on 3.10.8, 16 MiB from 4.0. A body just above 16 MiB
    is refused by delayq before it is sent, on every version (BodyTooLarge); sent raw,
    4.x refuses it and 3.10 takes it."""
    from delayq import BodyTooLarge
    from delayq.sync import Publisher

    topo = make_topology(["1s"])
    apply_topology(topo, rabbitmq_url)
    body = b"x" * (16 * 1024 * 1024 + 1)
    with Publisher(rabbitmq_url, topo) as publisher:
        with pytest.raises(BodyTooLarge):
            publisher.publish(body, "job.a", "0s")
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        holding = channel.queue_declare("", exclusive=True).method.queue
        if rabbitmq_version >= (4,):
            with pytest.raises(pex.ChannelClosedByBroker) as refused:
                channel.basic_publish("", holding, body)
            assert refused.value.reply_code == 406 and "max size" in refused.value.reply_text
        else:
            channel.basic_publish("", holding, body)
            assert channel.queue_declare(holding, passive=True).method.message_count == 1
    finally:
        if connection.is_open:
            connection.close()
