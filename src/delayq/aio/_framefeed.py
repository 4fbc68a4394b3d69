"""The frame feed: :class:`~delayq.aio.AsyncConsumer`'s deliveries read from AMQP frames.

The default asyncio feed for ``amqp://`` and ``amqps://`` (:data:`delayq.links.ASYNC_FEEDS`).
Deliveries arrive on :mod:`delayq.aio._wire`, delayq's own AMQP client, whose
framing hands a consuming channel's ``Basic.Deliver``, content header and body
frames over as bytes: :mod:`delayq.aio._deliveries` reads the few fields a
:class:`~delayq.consume.delivery.Delivery` needs straight from them. No stream
reader, no pamqp objects, no aiormq message per delivery: receiving took over
half of a no-op consumer's time through aiormq. Acks and nacks are frames
encoded by hand, queued on the same wire in the order they are given and
written once per loop turn.

What it keeps from the aio-pika feed (:mod:`delayq.aio._feed`, still there for
``feed=AioPikaFeed(url)``): the topology is applied (or checked, for a user who
may not declare) through aio-pika at every opening, on the node the feed consumes
from (a multi-host URL's hosts are tried in turn); each delivery is handed over
in a task of its own with a :class:`FrameDelivery` that settles it; a connection
or channel that closes under the feed, or a consumer the broker cancels (its
queue went away, a quorum queue lost its leader), is reported once through
``on_lost``, and the consumer opens the feed again, on a new connection. A
delivery of an earlier connection is never settled on a later one: its ack
fails (the broker requeued it already).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pamqp import commands

from delayq.aio._connection import close_shielded, connect
from delayq.aio._deliveries import (
    DeliveryFrames,
    ack_frame,
    content_header,
    nack_frame,
    reject_frame,
)
from delayq.aio._framebatch import channel_error
from delayq.aio._framelink import open_wire
from delayq.aio._subscription import Subscription
from delayq.aio._wire import CONSUME_CHANNEL, ChannelClosed, Wire, WireClosed
from delayq.aio.ensure import ensure_topology
from delayq.consume.delivery import Delivery
from delayq.errors import ConnectionFailed
from delayq.links import AsyncOnDelivery, FeedLost
from delayq.topology.model import Topology
from delayq.urls import redact

__all__ = ["FrameDelivery", "FrameFeed"]

log = logging.getLogger("delayq.consumer")


class FrameDelivery:
    """A :class:`~delayq.links.Settleable`: one delivery's tag on its consuming channel."""

    __slots__ = ("_channel", "delivery_tag")

    def __init__(self, channel: _Consuming, tag: int) -> None:
        self._channel = channel
        self.delivery_tag: int | None = tag

    async def ack(self, multiple: bool = False) -> None:
        assert self.delivery_tag is not None
        self._channel.settle(ack_frame(CONSUME_CHANNEL, self.delivery_tag, multiple))

    async def nack(self, multiple: bool = False, requeue: bool = True) -> None:
        assert self.delivery_tag is not None
        tag = self.delivery_tag
        if multiple:
            self._channel.settle(nack_frame(CONSUME_CHANNEL, tag, multiple, requeue))
        else:  # counted toward a delivery limit on RabbitMQ 4.3 too (links.Settleable)
            self._channel.settle(reject_frame(CONSUME_CHANNEL, tag, requeue))


class _Consuming(DeliveryFrames):
    """The consuming channel's reader (:class:`~delayq.aio._wire.ChannelReader`): puts
    each delivery together from its frames and hands it over."""

    def __init__(self, feed: FrameFeed, wire: Wire, on_delivery: AsyncOnDelivery) -> None:
        super().__init__()
        self.feed = feed
        self.wire = wire
        self.queue = feed.queue
        self.on_delivery = on_delivery
        self.gone: Exception | None = None
        """Why the channel is closed (``None`` while open)."""
        self._loop = wire.loop

    def settle(self, frame: bytes) -> None:
        """Queue an ack or a nack; raises if this channel is gone (the broker requeued
        its unsettled deliveries: a tag of it means nothing on another channel)."""
        if self.gone is not None:
            raise self.gone
        self.wire.send_frames(frame)

    def whole(self, deliver: tuple[int, bool, str], header: bytes, body: bytes) -> None:
        tag, redelivered, routing_key = deliver
        try:
            _size, content_type, headers, message_id = content_header(header)
        except Exception as exc:  # one such message must not stop the consumer
            why = f"{type(exc).__name__}: {exc}"[:500]
            self.settle(nack_frame(CONSUME_CHANNEL, tag, False, False))  # to its DLQ, intact
            log.warning(
                "rejected delivery %d of %s to its dead-letter queue, as it came: its "
                "headers cannot be read (%s)",
                tag,
                self.queue,
                why,
            )
            return
        delivery = Delivery(
            self.queue, body, routing_key, message_id, content_type, headers, redelivered
        )
        self._loop.create_task(self.on_delivery(FrameDelivery(self, tag), delivery))

    def cancelled(self, consumer_tag: str) -> None:
        self.feed.broker_cancelled(self, consumer_tag)

    def closed(self, exc: Exception) -> None:
        self.gone = exc
        self.feed.channel_lost(self, exc)


class FrameFeed(Subscription):
    """An :class:`~delayq.links.AsyncFeed` from RabbitMQ on delayq's own AMQP client."""

    inline = False
    clock_ms: Callable[[], int] | None = None

    _lost_errors = (WireClosed, ChannelClosed)

    def __init__(self, url: str) -> None:
        super().__init__()
        self._url = url
        self.queue = ""
        self._wire: Wire | None = None
        self._reader: _Consuming | None = None
        self._live = False
        """Opened and not closed since: only then is a lost channel reported."""
        self._on_lost: Callable[[BaseException], None] = lambda exc: None

    def __repr__(self) -> str:
        return f"FrameFeed({redact(self._url)!r})"

    async def open(
        self,
        topology: Topology,
        queue: str,
        prefetch: int,
        on_delivery: AsyncOnDelivery,
        on_lost: Callable[[BaseException], None],
    ) -> None:
        name = f"delayq-consumer {queue}"
        wire = await open_wire(self._url, attempts=3, name=name, publish=False)
        self.queue, self._on_lost = queue, on_lost
        reader = _Consuming(self, wire, on_delivery)
        try:
            # Declared through the node it consumes from (of a multi-host URL's), so the
            # queues a first start declares are led where their consumer is.
            admin = await connect(wire.url or self._url, name=name)
            try:
                await ensure_topology(topology, admin)  # or check it, if refused
            finally:  # not cut by a cancel (stop() cancels a reconnect opening the feed)
                await close_shielded(admin)
            await wire.open_channel(CONSUME_CHANNEL)
            wire.readers[CONSUME_CHANNEL] = reader
            self._wire, self._reader = wire, reader
            await self._qos(prefetch)
            await self._subscribe()
            self._live = True
        except BaseException as exc:
            self._wire = self._reader = None
            wire.abort()
            if isinstance(exc, ChannelClosed):  # e.g. may not read it (see delayq.ops.grant)
                raise channel_error(exc) from exc
            if isinstance(exc, WireClosed):
                raise ConnectionFailed(
                    f"lost the broker at {redact(self._url)} while subscribing to {queue!r}: {exc}"
                ) from exc
            raise

    def _channel_now(self) -> object | None:
        return self._reader

    async def _cancel(self, tag: str) -> None:
        await self._call(commands.Basic.Cancel(consumer_tag=tag), commands.Basic.CancelOk)

    async def _qos(self, prefetch: int) -> None:
        await self._call(commands.Basic.Qos(prefetch_count=prefetch), commands.Basic.QosOk)

    async def _consume(self) -> str:
        ok = await self._call(commands.Basic.Consume(queue=self.queue), commands.Basic.ConsumeOk)
        return str(ok.consumer_tag)

    async def _call(self, method: Any, reply: type) -> Any:
        wire = self._wire
        if wire is None:
            raise WireClosed(0, "the feed is closed")
        return await wire.call(CONSUME_CHANNEL, method, reply)

    def broker_cancelled(self, reader: _Consuming, consumer_tag: str) -> None:
        if self._live and reader is self._reader and self._is_ours(consumer_tag):
            self._on_lost(RuntimeError("the broker cancelled the consumer"))

    def channel_lost(self, reader: _Consuming, exc: Exception) -> None:
        if self._live and reader is self._reader:  # not one this feed closed itself
            self._on_lost(exc)

    async def ready(self) -> int:
        wire = self._wire
        if wire is None:
            return 0
        try:
            return await wire.queue_depth(self.queue)
        except (WireClosed, ChannelClosed) as exc:
            raise FeedLost(repr(exc)) from exc

    async def close(self) -> None:
        wire = self._wire
        self._wire = self._reader = None  # what closes now is not lost
        self._live = False
        self._forget()
        if wire is not None:
            await wire.close()
