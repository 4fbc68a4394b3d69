"""What ``bench/publish.py`` measures: its settings, the broker context, and each mode
(delayq's publishers and the raw clients' loops they are compared with), one function each.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import aio_pika
import pika
import pika.exceptions as pex
from benchlib import (
    log,
)

from delayq import Ladder, Message, Topology, build_declarations
from delayq.aio import AsyncPublisher
from delayq.message.factory import MessageFactory
from delayq.sync import Publisher
from delayq.topology.declarations import ExchangeDecl, QueueDecl

ROUTING_KEY = "bench.publish"
DELAY = "1h"
LADDER = Ladder.parse(["1h"])
"""One tier whose TTL outlasts the run: published messages stay parked, unconsumed."""

FRAMEWORK_VS_RAW_TARGET = 0.90
PIPELINED_VS_SINGLE_TARGET = 3.00


# Settings and shared context -------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    single_count: int
    batch_count: int
    body_bytes: int
    window: int
    rounds: int


@dataclass(frozen=True)
class Context:
    """Everything a measurement needs; built once per run."""

    url: str
    settings: Settings
    topology: Topology
    exchange: str
    """The tier exchange every message is published to."""
    queue: str
    """The tier queue behind it, which parks the messages."""
    body: bytes
    headers: dict[str, Any]
    """The headers delayq sends for this body, routing key and delay."""
    content_type: str
    timestamp_s: int

    @classmethod
    def create(cls, url: str, settings: Settings) -> Context:
        # No destination: the messages park in the 1 h tier; the key is declared bound
        # elsewhere so the publisher's routing check lets it through.
        topology = Topology(
            namespace=f"bench{secrets.token_hex(4)}", ladder=LADDER, external_bindings=[ROUTING_KEY]
        )
        body = os.urandom(settings.body_bytes)
        sample = MessageFactory(topology).build(body, ROUTING_KEY, DELAY)
        tier = topology.ladder.select_ms(sample.receipt.delay_ms)
        assert tier is not None and sample.exchange == topology.tier_name(tier)
        return cls(
            url=url,
            settings=settings,
            topology=topology,
            exchange=sample.exchange,
            queue=topology.tier_name(tier),
            body=body,
            headers=sample.headers,
            content_type=sample.content_type,
            timestamp_s=sample.timestamp_s,
        )


def warmup_count(count: int) -> int:
    """Messages sent untimed before a measurement, on the same connection."""
    return max(1, min(count // 10, 500))


# Broker administration (short-lived blocking connections) --------------------------------


def delete_namespace(url: str, topology: Topology) -> None:
    """Delete the namespace's queues, then its exchanges; missing ones are skipped."""
    declarations = build_declarations(topology)
    queues = [d.name for d in declarations if isinstance(d, QueueDecl)]
    exchanges = [d.name for d in declarations if isinstance(d, ExchangeDecl)]
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        for kind, name in [("queue", q) for q in queues] + [("exchange", e) for e in exchanges]:
            try:
                if kind == "queue":
                    channel.queue_delete(name)
                else:
                    channel.exchange_delete(name)
            except pex.ChannelClosedByBroker as exc:
                log(f"  could not delete {kind} {name}: {exc.reply_text}")
                channel = connection.channel()
    finally:
        connection.close()
    log(f"deleted {len(queues)} queues and {len(exchanges)} exchanges of {topology.namespace}")


# Timing -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    """Wall-clock seconds and this process's CPU seconds (the client's own work)."""

    wall_s: float = 0.0
    cpu_s: float = 0.0

    def __add__(self, other: Timing) -> Timing:
        return Timing(self.wall_s + other.wall_s, self.cpu_s + other.cpu_s)


class Stopwatch:
    def __init__(self) -> None:
        self._wall = time.perf_counter()
        self._cpu = time.process_time()

    def read(self) -> Timing:
        return Timing(time.perf_counter() - self._wall, time.process_time() - self._cpu)


# The measurements -------------------------------------------------------------------------
# Each times ``count`` confirmed publishes after the connection is open and a
# warm-up batch is sent (``Publisher.publish_many`` connects per call by design,
# so its figure includes that).

SYNC_PUBLISH = "delayq-sync-publish"
RAW_PIKA_SINGLE = "raw-pika-single"
ASYNC_MANY = "delayq-async-many"
RAW_AIO_PIPELINED = "raw-aio-pika"
SYNC_MANY = "delayq-sync-many"

LABELS = {
    SYNC_PUBLISH: "delayq Publisher.publish",
    RAW_PIKA_SINGLE: "raw pika, 1 confirm at a time",
    ASYNC_MANY: "delayq AsyncPublisher.publish_many",
    RAW_AIO_PIPELINED: "raw aio-pika, pipelined",
    SYNC_MANY: "delayq Publisher.publish_many",
}

BLOCK = 100
"""Publishes per turn when the two single-publish modes take turns (about 50 ms)."""


def raw_pika_publish(ctx: Context, channel: Any) -> None:
    properties = pika.BasicProperties(
        content_type=ctx.content_type,
        delivery_mode=2,
        message_id=uuid.uuid4().hex,
        timestamp=ctx.timestamp_s,
        headers=ctx.headers,
    )
    # On a confirm_delivery() channel this waits for the confirm, and raises
    # UnroutableError or NackError unless the broker took the message.
    channel.basic_publish(ctx.exchange, ROUTING_KEY, ctx.body, properties, mandatory=True)


def single_publish_pair(ctx: Context, framework_first: bool) -> dict[str, Timing]:
    """``Publisher.publish`` and raw pika on two open connections, taking turns.

    One confirm at a time is bound by the round trip to the broker, which
    drifts with the load on the machine; alternating blocks of ``BLOCK``
    publishes exposes both sides to the same conditions.
    """
    count = ctx.settings.single_count
    connection = pika.BlockingConnection(pika.URLParameters(ctx.url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        with Publisher(ctx.url, ctx.topology) as publisher:
            publisher.connect()
            senders: dict[str, Callable[[], object]] = {
                SYNC_PUBLISH: lambda: publisher.publish(ctx.body, ROUTING_KEY, DELAY),
                RAW_PIKA_SINGLE: lambda: raw_pika_publish(ctx, channel),
            }
            order = list(senders) if framework_first else list(reversed(senders))
            for key in order:
                for _ in range(warmup_count(count)):
                    senders[key]()
            totals = {key: Timing() for key in order}
            for done in range(0, count, BLOCK):
                block = min(BLOCK, count - done)
                for key in order:
                    send = senders[key]
                    watch = Stopwatch()
                    for _ in range(block):
                        send()
                    totals[key] += watch.read()
            return totals
    finally:
        connection.close()


def batch_of(ctx: Context, count: int) -> list[Message]:
    return [Message(ctx.body, ROUTING_KEY, DELAY) for _ in range(count)]


def delayq_async_publish_many(ctx: Context) -> Timing:
    count, window = ctx.settings.batch_count, ctx.settings.window

    async def run() -> Timing:
        async with AsyncPublisher(ctx.url, ctx.topology) as publisher:
            await publisher.publish_many(batch_of(ctx, warmup_count(count)), window=window)
            batch = batch_of(ctx, count)
            watch = Stopwatch()
            receipts = await publisher.publish_many(batch, window=window)
            timing = watch.read()
            assert len(receipts) == count
            return timing

    return asyncio.run(run())


def raw_aio_pika_pipelined(ctx: Context) -> Timing:
    count, window = ctx.settings.batch_count, ctx.settings.window
    timestamp = datetime.fromtimestamp(ctx.timestamp_s, tz=timezone.utc)

    async def run() -> Timing:
        connection = await aio_pika.connect(ctx.url)
        async with connection:
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            exchange = await channel.get_exchange(ctx.exchange, ensure=False)

            async def publish(n: int) -> None:
                slots = asyncio.Semaphore(window)

                async def publish_one() -> None:
                    try:
                        # Waits for the confirm; raises on a Basic.Return or Basic.Nack.
                        await exchange.publish(
                            aio_pika.Message(
                                ctx.body,
                                headers=ctx.headers,
                                content_type=ctx.content_type,
                                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                                message_id=uuid.uuid4().hex,
                                timestamp=timestamp,
                            ),
                            ROUTING_KEY,
                            mandatory=True,
                        )
                    finally:
                        slots.release()

                tasks = []
                for _ in range(n):
                    await slots.acquire()
                    tasks.append(asyncio.create_task(publish_one()))
                await asyncio.gather(*tasks)

            await publish(warmup_count(count))
            watch = Stopwatch()
            await publish(count)
            return watch.read()

    return asyncio.run(run())


def delayq_sync_publish_many(ctx: Context) -> Timing:
    count, window = ctx.settings.batch_count, ctx.settings.window
    with Publisher(ctx.url, ctx.topology) as publisher:
        publisher.publish_many(batch_of(ctx, warmup_count(count)), window=window)
        batch = batch_of(ctx, count)
        watch = Stopwatch()
        receipts = publisher.publish_many(batch, window=window)
        timing = watch.read()
        assert len(receipts) == count
        return timing
