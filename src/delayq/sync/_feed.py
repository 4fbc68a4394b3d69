"""The blocking feed (pika): where :class:`~delayq.sync.Consumer`'s deliveries come from.

One connection and one channel per opening; everything runs in the consumer's
own thread (pika's BlockingConnection is not thread-safe), except :meth:`wake`.
Whatever pika raises once the feed is open becomes :class:`~delayq.links.FeedLost`
(the consumer opens the feed again) or, when the broker refuses consuming,
:class:`~delayq.errors.AccessRefused`. Registered in :data:`delayq.links.FEEDS`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pika
from pika.adapters.blocking_connection import BlockingChannel

from delayq.consume.delivery import Delivery
from delayq.links import FeedLost, OnDelivery
from delayq.sync._connection import close_quietly, connect
from delayq.sync._errors import CHANNEL_CLOSED, CLIENT_ERRORS, LOST, channel_error, feed_lost
from delayq.sync.ensure import ensure_topology
from delayq.topology.model import Topology

__all__ = ["PikaFeed"]

log = logging.getLogger("delayq.consumer")


class _ChannelSettler:
    """Settles a delivery on the channel it came on, while that is the feed's."""

    __slots__ = ("_channel", "_feed", "_tag")

    def __init__(self, feed: PikaFeed, channel: BlockingChannel, tag: int) -> None:
        self._feed, self._channel, self._tag = feed, channel, tag

    @property
    def current(self) -> bool:
        return self._channel is self._feed.channel

    def ack(self) -> None:
        try:
            self._channel.basic_ack(self._tag)  # by tag, never multiple
        except LOST as exc:
            raise feed_lost(exc) from exc

    def requeue(self) -> None:
        try:
            self._channel.basic_nack(self._tag, requeue=True)
        except LOST as exc:
            raise feed_lost(exc) from exc


class PikaFeed:
    """A :class:`~delayq.links.Feed` from RabbitMQ through pika's blocking connection."""

    inline = False
    clock_ms: Callable[[], int] | None = None

    def __init__(self, url: str) -> None:
        self._url = url
        self._connection: pika.BlockingConnection | None = None
        self.channel: BlockingChannel | None = None
        """The channel deliveries come on now (``None`` while closed)."""
        self._queue = ""
        self._tag: str | None = None
        self._cancelled = False
        self._on_delivery: OnDelivery | None = None

    def open(self, topology: Topology, queue: str, prefetch: int, on_delivery: OnDelivery) -> None:
        connection = connect(self._url, name=f"delayq-consumer {queue}")
        try:
            ensure_topology(topology, connection)  # or check it, if refused
            channel = connection.channel()
            channel.add_on_cancel_callback(self._on_cancelled)
            channel.basic_qos(prefetch_count=prefetch)
            try:
                tag = channel.basic_consume(queue, self._on_message)
            except CHANNEL_CLOSED as exc:  # may not read it (see delayq.ops.grant)
                raise channel_error(exc) from exc
        except BaseException:
            close_quietly(connection)
            raise
        self._cancelled = False
        self._queue, self._on_delivery = queue, on_delivery
        self._connection, self.channel, self._tag = connection, channel, tag

    @property
    def consuming(self) -> bool:
        return self._tag is not None

    def _on_message(
        self, channel: Any, method: Any, props: pika.BasicProperties, body: bytes
    ) -> None:
        delivery = Delivery(
            queue=self._queue,
            body=body,
            routing_key=method.routing_key or "",
            message_id=props.message_id,
            content_type=props.content_type,
            headers=props.headers or {},
            redelivered=bool(method.redelivered),
        )
        assert self._on_delivery is not None
        self._on_delivery(_ChannelSettler(self, channel, method.delivery_tag), delivery)

    def _on_cancelled(self, _frame: Any) -> None:
        self._cancelled = True

    def resubscribe(self, prefetch: int) -> None:
        """A consumer's prefetch cannot change once it consumes, and quorum queues
        refuse a channel-wide one: cancel, then consume again."""
        channel = self.channel
        assert channel is not None and self._tag is not None
        try:
            channel.basic_cancel(self._tag)
            channel.basic_qos(prefetch_count=prefetch)
            self._tag = channel.basic_consume(self._queue, self._on_message)
        except LOST as exc:
            raise feed_lost(exc) from exc

    def pump(self, time_limit_s: float) -> None:
        assert self._connection is not None
        try:
            self._connection.process_data_events(time_limit=time_limit_s)
        except LOST as exc:
            raise feed_lost(exc) from exc
        if self._cancelled:
            # Its queue went away, or a quorum queue lost its leader: nothing arrives
            # any more on this channel although it stays open.
            raise FeedLost(f"the broker cancelled the consumer of {self._queue}")

    def unsubscribe(self) -> None:
        channel = self.channel
        if channel is not None and channel.is_open and self._tag is not None:
            try:
                channel.basic_cancel(self._tag)
            except CLIENT_ERRORS as exc:
                log.debug("cancel failed: %r", exc)
        self._tag = None

    def ready(self) -> int:
        assert self._connection is not None
        try:
            probe = self._connection.channel()
            try:
                ok = probe.queue_declare(self._queue, passive=True)
                return int(ok.method.message_count)
            finally:
                close_quietly(probe)
        except LOST as exc:
            raise feed_lost(exc) from exc

    def sleep(self, seconds: float) -> None:
        if self._connection is not None:
            try:
                self._connection.sleep(seconds)  # keeps heartbeats flowing
            except LOST as exc:
                raise feed_lost(exc) from exc

    def wake(self) -> None:
        connection = self._connection
        if connection is not None:
            try:
                connection.add_callback_threadsafe(lambda: None)
            except Exception:  # closed meanwhile: the pump polls anyway
                pass

    def close(self) -> None:
        """Cancel consuming (unacked deliveries go back to the queue) and close."""
        if self.channel is not None and self.channel.is_open:
            self.unsubscribe()
        close_quietly(self.channel)
        close_quietly(self._connection)
        self.channel = None
        self._connection = None
        self._tag = None
