"""The asyncio feed (aio-pika): where :class:`~delayq.aio.AsyncConsumer`'s deliveries come from.

One connection and one channel per opening. Each delivery is handed over in the
task aio-pika runs it in; a connection or channel that closes under the feed,
or a consumer the broker cancels (its queue went away, a quorum queue lost its
leader), is reported once through ``on_lost``: the consumer opens the feed
again. Registered in :data:`delayq.links.ASYNC_FEEDS`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage

from delayq.aio._connection import close_quietly, connect
from delayq.aio._errors import CHANNEL_CLOSED, channel_error
from delayq.aio.ensure import ensure_topology
from delayq.consume.delivery import Delivery
from delayq.links import AsyncOnDelivery, FeedLost
from delayq.topology.model import Topology

__all__ = ["AioPikaFeed"]

log = logging.getLogger("delayq.consumer")


class AioPikaFeed:
    """An :class:`~delayq.links.AsyncFeed` from RabbitMQ through aio-pika."""

    inline = False
    clock_ms: Callable[[], int] | None = None

    def __init__(self, url: str) -> None:
        self._url = url
        self._connection: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None
        self._queue = ""
        self._tag: str | None = None
        self._subscribed = False
        self._consuming = False  # until the broker confirmed a cancel
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
            amqp_queue = await channel.get_queue(queue, ensure=False)
            self._queue, self._on_delivery, self._on_lost = queue, on_delivery, on_lost
            self._connection, self._channel = connection, channel
            self._subscribed = True
            try:
                self._tag = await amqp_queue.consume(self._on_message, no_ack=False)
                self._consuming = True
            except CHANNEL_CLOSED as exc:  # e.g. may not read it (see delayq.ops.grant)
                raise channel_error(exc) from exc
        except BaseException:
            self._connection = self._channel = None
            await close_quietly(connection)
            raise
        connection.close_callbacks.add(self._closed)
        channel.close_callbacks.add(self._closed)
        # The broker cancels a consumer when its queue goes away or restarts (a quorum
        # queue losing its leader): the channel stays open but nothing arrives any more.
        channel.channel.on_consumer_cancel_callbacks.add(self._cancelled)

    @property
    def consuming(self) -> bool:
        return self._consuming

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        delivery = Delivery(
            queue=self._queue,
            body=message.body,
            routing_key=message.routing_key or "",
            message_id=message.message_id,
            content_type=message.content_type,
            headers=message.headers or {},
            redelivered=bool(message.redelivered),
        )
        assert self._on_delivery is not None
        await self._on_delivery(message, delivery)

    def _closed(self, sender: object, exc: BaseException | None = None) -> None:
        if sender is not None and sender in (self._connection, self._channel):
            self._on_lost(exc or RuntimeError("the connection closed"))

    def _cancelled(self, frame: Any) -> None:
        if self._tag is not None and getattr(frame, "consumer_tag", None) == self._tag:
            self._on_lost(RuntimeError("the broker cancelled the consumer"))

    async def resubscribe(self, prefetch: int) -> None:
        """A consumer's prefetch cannot change once it consumes, and quorum queues
        refuse a channel-wide one: cancel, then consume again."""
        channel, old_tag = self._channel, self._tag
        if channel is None or old_tag is None:
            return
        try:
            amqp_queue = await channel.get_queue(self._queue, ensure=False)
            self._tag = None  # the cancel below is ours, not the broker's
            await amqp_queue.cancel(old_tag)
            await channel.set_qos(prefetch_count=prefetch)
            if not self._subscribed or channel is not self._channel:
                return  # unsubscribed or reopened meanwhile
            self._tag = await amqp_queue.consume(self._on_message, no_ack=False)
        except Exception as exc:
            raise FeedLost(repr(exc)) from exc

    async def unsubscribe(self) -> None:
        self._subscribed = False
        channel, tag = self._channel, self._tag
        self._tag = None
        if channel is None or tag is None:
            self._consuming = False
            return
        try:
            amqp_queue = await channel.get_queue(self._queue, ensure=False)
            await amqp_queue.cancel(tag)  # returns once the broker confirmed it
        except Exception as exc:
            log.debug("cancel failed: %r", exc)
        self._consuming = False

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
        self._connection = self._channel = None  # what closes now is not lost
        self._tag = None
        self._consuming = False
        await close_quietly(channel)
        await close_quietly(connection)
