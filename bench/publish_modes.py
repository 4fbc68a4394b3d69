"""What ``bench/publish.py`` measures: its settings, the broker context, and each mode
(delayq's publishers and the raw clients' loops they are compared with), one function each.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import resource
import secrets
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any
from urllib.parse import unquote, urlsplit

import aio_pika
import pika
import pika.exceptions as pex
from benchlib import (
    log,
)
from pamqp import body as pbody
from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader

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
ASYNC_VS_RAW_AIO_TARGET = 3.00
"""The frame link against the usual aio-pika pattern (a task and a future per message)."""
ASYNC_VS_SYNC_MANY_TARGET = 0.90
PIPELINED_VS_SINGLE_TARGET = 3.00


# Settings and shared context -------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    single_count: int
    batch_count: int
    body_bytes: int
    window: int
    rounds: int
    callers: int = 100
    """Concurrent callers of the single-publish modes with callers (``--callers``)."""
    modes: frozenset[str] = frozenset()
    """The modes to run (empty: all); see ``bench/publish.py --modes``."""
    work_us: float = 14.0
    """Client CPU a message the ``raw-frames-work`` mode spends (``--work-us``)."""


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
    tracing: Any = None
    """The tracer provider of the traced modes (``--tracing``), else ``None``."""

    @classmethod
    def create(cls, url: str, settings: Settings, tracing: Any = None) -> Context:
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
            tracing=tracing,
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
    """Wall-clock seconds, this process's CPU seconds (the client's own work) and its
    context switches (every thread's, voluntary or not)."""

    wall_s: float = 0.0
    cpu_s: float = 0.0
    switches: int = 0

    def __add__(self, other: Timing) -> Timing:
        return Timing(
            self.wall_s + other.wall_s, self.cpu_s + other.cpu_s, self.switches + other.switches
        )


def context_switches() -> int:
    """This process's context switches so far, all its threads' (``getrusage``)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_nvcsw + usage.ru_nivcsw


class Stopwatch:
    def __init__(self) -> None:
        self._wall = time.perf_counter()
        self._cpu = time.process_time()
        self._switches = context_switches()

    def read(self) -> Timing:
        return Timing(
            time.perf_counter() - self._wall,
            time.process_time() - self._cpu,
            context_switches() - self._switches,
        )


# The measurements -------------------------------------------------------------------------
# Each times ``count`` confirmed publishes after the connection is open and a
# warm-up batch is sent (``Publisher.publish_many`` connects per call by design,
# so its figure includes that).

SYNC_PUBLISH = "delayq-sync-publish"
RAW_PIKA_SINGLE = "raw-pika-single"
ASYNC_MANY = "delayq-async-many"
RAW_AIO_PIPELINED = "raw-aio-pika"
SYNC_MANY = "delayq-sync-many"
RAW_FRAMES = "raw-frames"
RAW_FRAMES_WORK = "raw-frames-work"
SYNC_PUBLISH_TRACED = "delayq-sync-publish-traced"
ASYNC_MANY_TRACED = "delayq-async-many-traced"
SYNC_MANY_TRACED = "delayq-sync-many-traced"
TRACED = {
    SYNC_PUBLISH: SYNC_PUBLISH_TRACED,
    ASYNC_MANY: ASYNC_MANY_TRACED,
    SYNC_MANY: SYNC_MANY_TRACED,
}
"""The untraced mode each traced one (``--tracing``) is compared with."""

LABELS = {
    SYNC_PUBLISH: "delayq Publisher.publish",
    RAW_PIKA_SINGLE: "raw pika, 1 confirm at a time",
    ASYNC_MANY: "delayq AsyncPublisher.publish_many",
    RAW_AIO_PIPELINED: "raw aio-pika, pipelined",
    SYNC_MANY: "delayq Publisher.publish_many",
    RAW_FRAMES: "raw frames on a socket (the limit)",
    RAW_FRAMES_WORK: "raw frames + N us of client CPU a message",
    SYNC_PUBLISH_TRACED: "delayq Publisher.publish, traced",
    ASYNC_MANY_TRACED: "delayq AsyncPublisher.publish_many, traced",
    SYNC_MANY_TRACED: "delayq Publisher.publish_many, traced",
}

BLOCK = 100
"""Publishes per turn when the two single-publish modes take turns (about 50 ms)."""


def raw_pika_properties(ctx: Context) -> Any:
    """A message's properties as delayq sets them, with a fresh ``message_id``."""
    return pika.BasicProperties(
        content_type=ctx.content_type,
        delivery_mode=2,
        message_id=uuid.uuid4().hex,
        timestamp=ctx.timestamp_s,
        headers=ctx.headers,
    )


def raw_pika_publish(ctx: Context, channel: Any) -> None:
    # On a confirm_delivery() channel this waits for the confirm, and raises
    # UnroutableError or NackError unless the broker took the message.
    channel.basic_publish(
        ctx.exchange, ROUTING_KEY, ctx.body, raw_pika_properties(ctx), mandatory=True
    )


def single_publish_pair(ctx: Context, framework_first: bool) -> dict[str, Timing]:
    """``Publisher.publish`` and raw pika on two open connections, taking turns.

    One confirm at a time is bound by the round trip to the broker, which
    drifts with the load on the machine; alternating blocks of ``BLOCK``
    publishes exposes both sides to the same conditions.
    """
    count = ctx.settings.single_count
    connection = pika.BlockingConnection(pika.URLParameters(ctx.url))
    traced = Publisher(ctx.url, ctx.topology, tracing=ctx.tracing or False)
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        with Publisher(ctx.url, ctx.topology) as publisher:
            publisher.connect()
            senders: dict[str, Callable[[], object]] = {
                SYNC_PUBLISH: lambda: publisher.publish(ctx.body, ROUTING_KEY, DELAY),
                RAW_PIKA_SINGLE: lambda: raw_pika_publish(ctx, channel),
            }
            if ctx.tracing is not None:  # a third connection, in the same turns
                traced.connect()
                senders[SYNC_PUBLISH_TRACED] = lambda: traced.publish(ctx.body, ROUTING_KEY, DELAY)
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
        traced.close()
        connection.close()


def batch_of(ctx: Context, count: int) -> list[Message]:
    return [Message(ctx.body, ROUTING_KEY, DELAY) for _ in range(count)]


def delayq_async_publish_many(ctx: Context, traced: bool = False) -> Timing:
    count, window = ctx.settings.batch_count, ctx.settings.window
    # Untraced: the default (tracing=None, no global provider set), as users run it.
    tracing = ctx.tracing if traced else None

    async def run() -> Timing:
        async with AsyncPublisher(ctx.url, ctx.topology, tracing=tracing) as publisher:
            await publisher.publish_many(batch_of(ctx, warmup_count(count)), window=window)
            batch = batch_of(ctx, count)
            watch = Stopwatch()
            receipts = await publisher.publish_many(batch, window=window)
            timing = watch.read()
            assert len(receipts) == count
            return timing

    return asyncio.run(run())


@contextlib.asynccontextmanager
async def confirming_exchange(ctx: Context) -> AsyncIterator[aio_pika.abc.AbstractExchange]:
    """The bench exchange on an aio-pika channel with publisher confirms (a publish waits
    for its confirm and raises on a Basic.Return or Basic.Nack)."""
    connection = await aio_pika.connect(ctx.url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        yield await channel.get_exchange(ctx.exchange, ensure=False)


def raw_message(ctx: Context) -> aio_pika.Message:
    """One message as delayq's publishers send it: persistent, an id and a timestamp."""
    return aio_pika.Message(
        ctx.body,
        headers=ctx.headers,
        content_type=ctx.content_type,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        message_id=uuid.uuid4().hex,
        timestamp=utc(ctx.timestamp_s),
    )


@functools.cache
def utc(timestamp_s: int) -> datetime:
    return datetime.fromtimestamp(timestamp_s, tz=timezone.utc)


def raw_aio_pika_pipelined(ctx: Context) -> Timing:
    count, window = ctx.settings.batch_count, ctx.settings.window

    async def run() -> Timing:
        async with confirming_exchange(ctx) as exchange:

            async def publish(n: int) -> None:
                slots = asyncio.Semaphore(window)

                async def publish_one() -> None:
                    try:
                        await exchange.publish(raw_message(ctx), ROUTING_KEY, mandatory=True)
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


def delayq_sync_publish_many(ctx: Context, traced: bool = False) -> Timing:
    count, window = ctx.settings.batch_count, ctx.settings.window
    with Publisher(ctx.url, ctx.topology, tracing=ctx.tracing if traced else None) as publisher:
        publisher.publish_many(batch_of(ctx, warmup_count(count)), window=window)
        batch = batch_of(ctx, count)
        watch = Stopwatch()
        receipts = publisher.publish_many(batch, window=window)
        timing = watch.read()
        assert len(receipts) == count
        return timing


# The physical limit: raw frames on a socket ------------------------------------------------


class _FrameSocket:
    """A blocking AMQP connection spoken in pamqp frames: just enough to publish."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.sock = socket.create_connection((parts.hostname or "localhost", parts.port or 5672))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""
        self.sock.sendall(pheader.ProtocolHeader().marshal())
        self.expect(commands.Connection.Start)
        user, password = unquote(parts.username or "guest"), unquote(parts.password or "guest")
        self.send(
            0,
            commands.Connection.StartOk(
                client_properties={"product": "bench"},
                mechanism="PLAIN",
                response=f"\0{user}\0{password}",
                locale="en_US",
            ),
        )
        tune = self.expect(commands.Connection.Tune)
        self.frame_max = tune.frame_max
        self.send(0, commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0))
        vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
        self.send(0, commands.Connection.Open(virtual_host=vhost))
        self.expect(commands.Connection.OpenOk)
        self.send(1, commands.Channel.Open())
        self.expect(commands.Channel.OpenOk)
        self.send(1, commands.Confirm.Select())
        self.expect(commands.Confirm.SelectOk)

    def send(self, channel: int, method: Any) -> None:
        self.sock.sendall(pframe.marshal(method, channel))

    def frames(self) -> list[Any]:
        """The frames of one read (at least one)."""
        while True:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            data = self.buffer + chunk
            found, offset = [], 0
            while len(data) - offset >= 8:
                size = int.from_bytes(data[offset + 3 : offset + 7], "big") + 8
                if len(data) - offset < size:
                    break
                _, _, value = pframe.unmarshal(data[offset : offset + size])
                found.append(value)
                offset += size
            self.buffer = data[offset:]
            if found:
                return found

    def expect(self, kind: type) -> Any:
        for value in self.frames():
            if isinstance(value, kind):
                return value
            raise RuntimeError(f"expected {kind.__name__}, got {value!r}")
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.sock.close()


def encoded_publishes(ctx: Context, count: int, frame_max: int) -> list[bytes]:
    """``count`` publishes as delayq sends them (fresh message ids), encoded by pamqp."""
    out = []
    for _ in range(count):
        props = commands.Basic.Properties(
            content_type=ctx.content_type,
            delivery_mode=2,
            message_id=uuid.uuid4().hex,
            timestamp=datetime.fromtimestamp(ctx.timestamp_s, tz=timezone.utc),
            headers=ctx.headers,
        )
        frames = [
            pframe.marshal(
                commands.Basic.Publish(
                    exchange=ctx.exchange, routing_key=ROUTING_KEY, mandatory=True
                ),
                1,
            ),
            pframe.marshal(pheader.ContentHeader(0, len(ctx.body), props), 1),
        ]
        limit = frame_max - 8
        frames += [
            pframe.marshal(pbody.ContentBody(ctx.body[i : i + limit]), 1)
            for i in range(0, len(ctx.body), limit)
        ]
        out.append(b"".join(frames))
    return out


def _spin(seconds: float) -> None:
    """Busy the CPU for ``seconds`` (work a client would do: no sleep, no I/O)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _publish_frames(
    wire: _FrameSocket, encoded: list[bytes], window: int, before: int, work_us: float = 0.0
) -> None:
    """Write ``encoded`` with up to ``window`` unconfirmed until the broker acked all of it
    (``before``: publishes already confirmed on the channel, whose delivery tags came first;
    ``work_us``: CPU spent a message before each write, as a client building them would)."""
    sent = confirmed = 0
    total = len(encoded)
    while confirmed < total:
        room = min(window - (sent - confirmed), total - sent)
        if room > 0:
            if work_us:
                _spin(work_us * room / 1e6)
            wire.sock.sendall(b"".join(encoded[sent : sent + room]))
            sent += room
        for value in wire.frames():
            if isinstance(value, commands.Basic.Ack):
                tag = value.delivery_tag - before
                confirmed = tag if value.multiple else confirmed + 1
            else:  # a nack, a return, a close: the limit is measured only when all is taken
                raise RuntimeError(f"unexpected from the broker: {value!r}")


def raw_frames_socket(ctx: Context, work_us: float = 0.0) -> Timing:
    """What the broker alone takes: publishes encoded by pamqp before the clock starts,
    written to a socket with up to ``window`` unconfirmed, confirms counted (no framework,
    no future per message, next to no client CPU). With ``work_us``, the same with that
    much client CPU spent a message in the writing thread: what a client's own work
    costs the broker's rate when the two share the machine's cores."""
    count, window = ctx.settings.batch_count, ctx.settings.window
    wire = _FrameSocket(ctx.url)
    try:
        warm = warmup_count(count)
        _publish_frames(wire, encoded_publishes(ctx, warm, wire.frame_max), window, 0)
        encoded = encoded_publishes(ctx, count, wire.frame_max)
        watch = Stopwatch()
        _publish_frames(wire, encoded, window, warm, work_us)
        return watch.read()
    finally:
        wire.close()


def raw_frames_working(ctx: Context) -> Timing:
    """:func:`raw_frames_socket` spending ``--work-us`` of client CPU a message."""
    return raw_frames_socket(ctx, ctx.settings.work_us)
