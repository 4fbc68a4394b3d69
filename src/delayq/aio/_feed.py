"""The aio-pika feed: :class:`~delayq.aio.AsyncConsumer`'s deliveries through aio-pika.

The default feed for ``amqp://`` is the frame feed (:mod:`delayq.aio._framefeed`);
this one stays for ``AsyncConsumer(..., feed=AioPikaFeed(url))``.

One connection and one channel per opening, opened with aio-pika (its errors:
:mod:`delayq.aio._errors`). The deliveries themselves are taken from aiormq,
under aio-pika: aio-pika's ``IncomingMessage`` copies every property of every
delivery into a locked object, which cost a no-op consumer about a tenth of its
CPU. Each delivery is handed over in the task aiormq runs it in, with an
:class:`AmqpDelivery` that settles it. A connection or channel that closes
under the feed, or a consumer the broker cancels (its queue went away, a quorum
queue lost its leader), is reported once through ``on_lost``: the consumer
opens the feed again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, cast

from aio_pika.abc import AbstractChannel, AbstractConnection
from aiormq.abc import AbstractChannel as AmqpChannel
from aiormq.abc import DeliveredMessage
from pamqp.commands import Basic

from delayq.aio._connection import close_quietly, connect
from delayq.aio._errors import CHANNEL_CLOSED, channel_error
from delayq.aio._subscription import Subscription
from delayq.aio.ensure import ensure_topology
from delayq.consume.delivery import Delivery
from delayq.links import AsyncOnDelivery, FeedLost
from delayq.topology.model import Topology

__all__ = ["AioPikaFeed", "AmqpDelivery"]

log = logging.getLogger("delayq.consumer")


class AmqpDelivery:
    """A :class:`~delayq.links.Settleable`: one delivery's tag on its aiormq channel.

    The frames go to the connection's write queue without waiting for the socket:
    an ack or a nack needs no answer, and the channel's frames stay in order (a
    nack is written before any later ``multiple`` ack that would cover its tag).
    """

    __slots__ = ("_channel", "delivery_tag")

    def __init__(self, channel: AmqpChannel, tag: int | None) -> None:
        self._channel = channel
        self.delivery_tag: int | None = tag

    async def ack(self, multiple: bool = False) -> None:
        assert self.delivery_tag is not None
        await self._channel.basic_ack(self.delivery_tag, multiple=multiple, wait=False)

    async def nack(self, multiple: bool = False, requeue: bool = True) -> None:
        assert self.delivery_tag is not None
        if not multiple:  # counted toward a delivery limit on RabbitMQ 4.3 too
            await self._channel.basic_reject(self.delivery_tag, requeue=requeue, wait=False)
            return
        await self._channel.basic_nack(
            self.delivery_tag, multiple=multiple, requeue=requeue, wait=False
        )


class AioPikaFeed(Subscription):
    """An :class:`~delayq.links.AsyncFeed` from RabbitMQ through aio-pika."""

    inline = False
    clock_ms: Callable[[], int] | None = None

    def __init__(self, url: str) -> None:
        super().__init__()
        self._url = url
        self._connection: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None
        self._amqp: AmqpChannel | None = None
        """The channel's aiormq channel, which deliveries come from."""
        self._queue = ""
        self._on_delivery: AsyncOnDelivery | None = None
        self._on_lost: Callable[[BaseException], None] = lambda exc: None

    async def open(
        self,
        topology: Topology,
        queue: str,
        prefetch: int,
        on_delivery: AsyncOnDelivery,
        on_lost: Callable[[BaseException], None],
    ) -> None:
        connection = await connect(self._url, name=f"delayq-consumer {queue}")
        try:
            await ensure_topology(topology, connection)  # or check it, if refused
            channel = await connection.channel(publisher_confirms=False)
            await channel.set_qos(prefetch_count=prefetch)
            amqp = await channel.get_underlay_channel()
            self._queue, self._on_delivery, self._on_lost = queue, on_delivery, on_lost
            self._connection, self._channel, self._amqp = connection, channel, amqp
            try:
                await self._subscribe()
            except CHANNEL_CLOSED as exc:  # e.g. may not read it (see delayq.ops.grant)
                raise channel_error(exc) from exc
        except BaseException:
            self._connection = self._channel = self._amqp = None
            await close_quietly(connection)
            raise
        connection.close_callbacks.add(self._closed)
        channel.close_callbacks.add(self._closed)
        # The broker cancels a consumer when its queue goes away or restarts (a quorum
        # queue losing its leader): the channel stays open but nothing arrives any more.
        amqp.on_consumer_cancel_callbacks.add(self._cancelled)

    def _channel_now(self) -> object | None:
        return self._amqp

    async def _cancel(self, tag: str) -> None:
        assert self._amqp is not None
        await self._amqp.basic_cancel(tag)

    async def _qos(self, prefetch: int) -> None:
        assert self._channel is not None
        await self._channel.set_qos(prefetch_count=prefetch)

    async def _consume(self) -> str:
        assert self._amqp is not None
        ok = await self._amqp.basic_consume(self._queue, self._on_message, no_ack=False)
        assert ok.consumer_tag is not None
        return ok.consumer_tag

    async def _on_message(self, message: DeliveredMessage) -> None:
        deliver = cast(Basic.Deliver, message.delivery)  # a consumer's delivery
        properties = message.header.properties
        delivery = Delivery(
            self._queue,
            message.body,
            deliver.routing_key or "",
            properties.message_id,
            properties.content_type,
            properties.headers or {},
            bool(deliver.redelivered),
        )
        assert self._on_delivery is not None
        await self._on_delivery(AmqpDelivery(message.channel, deliver.delivery_tag), delivery)

    def _closed(self, sender: object, exc: BaseException | None = None) -> None:
        if sender is not None and sender in (self._connection, self._channel):
            self._on_lost(exc or RuntimeError("the connection closed"))

    def _cancelled(self, frame: Any) -> None:
        if self._is_ours(getattr(frame, "consumer_tag", None)):
            self._on_lost(RuntimeError("the broker cancelled the consumer"))

    async def ready(self) -> int:
        channel = self._channel
        if channel is None:
            return 0
        try:
            amqp_queue = await channel.declare_queue(self._queue, passive=True)
        except Exception as exc:
            raise FeedLost(repr(exc)) from exc
        return amqp_queue.declaration_result.message_count or 0

    async def close(self) -> None:
        connection, channel = self._connection, self._channel
        self._connection = self._channel = self._amqp = None  # what closes now is not lost
        self._forget()
        await close_quietly(channel)
        await close_quietly(connection)
