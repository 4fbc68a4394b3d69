"""The blocking feed (pika): where :class:`~delayq.sync.Consumer`'s deliveries come from.

One connection and one channel per opening; everything runs in the consumer's
own thread (pika's BlockingConnection is not thread-safe), except :meth:`wake`.
Whatever pika raises once the feed is open becomes :class:`~delayq.links.FeedLost`
(the consumer opens the feed again) or, when the broker refuses consuming,
:class:`~delayq.errors.AccessRefused`. Registered in :data:`delayq.links.FEEDS`.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable
from typing import Any

import pika
from pika.adapters.blocking_connection import BlockingChannel

from delayq.consume.delivery import Delivery
from delayq.links import FeedLost, OnDelivery
from delayq.sync._acks import AckLine, ack_batch
from delayq.sync._connection import close_quietly, connect, read_content_headers
from delayq.sync._errors import CHANNEL_CLOSED, CLIENT_ERRORS, LOST, channel_error, feed_lost
from delayq.sync._unreadable import tolerate_unreadable_headers, unreadable
from delayq.sync.ensure import ensure_topology
from delayq.topology.model import Topology

__all__ = ["PikaFeed"]

log = logging.getLogger("delayq.consumer")


def _nothing() -> None:
    """What a wake runs in the feed thread: nothing; it only ends pika's poll."""


class _ChannelSettler:
    """Settles a delivery on the channel it came on, while that is the feed's: its ack
    is marked in the channel's :class:`~delayq.sync._acks.AckLine` and goes out with the
    loop turn's others (:meth:`PikaFeed.flush`)."""

    __slots__ = ("_channel", "_feed", "_line", "_tag")

    def __init__(self, feed: PikaFeed, channel: BlockingChannel, line: AckLine, tag: int) -> None:
        self._feed, self._channel, self._line, self._tag = feed, channel, line, tag

    @property
    def current(self) -> bool:
        return self._channel is self._feed.channel

    def ack(self) -> None:
        if self._channel is self._feed.channel and self._line.ack(self._tag):
            return  # sent before the feed thread waits for the broker again
        try:  # not an outstanding delivery of the channel's line: alone, never multiple
            self._channel.basic_ack(self._tag)
        except LOST as exc:
            raise feed_lost(exc) from exc

    def requeue(self) -> None:
        if self._channel is self._feed.channel:
            self._line.drop(self._tag)  # sent now, ahead of any ack that could cover it
        try:
            # a reject: RabbitMQ 4.3 counts it toward a quorum queue's delivery limit, a
            # nack not (a message that always comes back would cycle for ever)
            self._channel.basic_reject(self._tag, requeue=True)
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
        self._acks = AckLine()
        """The channel's outstanding deliveries, and the acks to send for them."""
        self._wakes: queue.SimpleQueue[None] = queue.SimpleQueue()
        """One item per :meth:`wake` (a handler ended), taken by the feed thread (a
        C queue: a cheaper handoff between threads than an ``Event``)."""
        self._polling = False
        """Whether the feed thread waits in pika's poll (where only pika's wake reaches)."""

    def open(self, topology: Topology, queue: str, prefetch: int, on_delivery: OnDelivery) -> None:
        connection = connect(self._url, name=f"delayq-consumer {queue}")
        read_content_headers(connection)  # delayq's decoder: pika's costs twice as much
        tolerate_unreadable_headers(connection)  # one such message must not stop the feed
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
        self._acks = AckLine(ack_batch(prefetch))  # a new channel's: no old tag is acked on it
        self._connection, self.channel, self._tag = connection, channel, tag

    @property
    def consuming(self) -> bool:
        return self._tag is not None

    def _on_message(
        self, channel: Any, method: Any, props: pika.BasicProperties, body: bytes
    ) -> None:
        why = unreadable(props)
        if why is not None:  # to the queue's DLQ, intact, by the broker's dead-lettering
            channel.basic_reject(method.delivery_tag, requeue=False)
            log.warning(
                "rejected delivery %d of %s to its dead-letter queue, as it came: pika "
                "cannot read its headers (%s)",
                method.delivery_tag,
                self._queue,
                why,
            )
            return
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
        tag = method.delivery_tag
        self._acks.track(tag)
        self._on_delivery(_ChannelSettler(self, channel, self._acks, tag), delivery)

    def _on_cancelled(self, _frame: Any) -> None:
        self._cancelled = True

    def resubscribe(self, prefetch: int) -> None:
        """A consumer's prefetch cannot change once it consumes, and quorum queues
        refuse a channel-wide one: cancel, then consume again."""
        channel = self.channel
        assert channel is not None and self._tag is not None
        try:
            self._take_in()
            channel.basic_cancel(self._tag)
            channel.basic_qos(prefetch_count=prefetch)
            self._tag = channel.basic_consume(self._queue, self._on_message)
            self._acks.batch = ack_batch(prefetch)
        except LOST as exc:
            raise feed_lost(exc) from exc

    def flush(self, *, waited: bool = False) -> None:
        """Send the acks due (see :mod:`delayq.sync._acks`): one ``multiple`` ack for the
        acked run at the head of the channel's deliveries, and those that waited long
        enough (or at all, if ``waited``) behind an unsettled one, one each."""
        acks = self._acks
        channel = self.channel
        if not acks.due or channel is None:
            return
        last, singles = acks.take(time.monotonic(), waited=waited)
        try:
            if last is not None:
                channel.basic_ack(last, multiple=True)
            for tag in singles:
                channel.basic_ack(tag)
        except LOST as exc:
            raise feed_lost(exc) from exc

    def pump(self, time_limit_s: float) -> None:
        """Send the acks due, then take in what the broker sent, waiting up to
        ``time_limit_s`` for it or for :meth:`wake` (less while acks are due)."""
        connection = self._connection
        assert connection is not None
        time_limit_s = self._send_acks(time_limit_s)
        self._polling = True  # from now on a wake must reach pika's poll
        try:
            if not self._wakes.empty():  # a handler ended already: do not wait
                time_limit_s = 0.0
            connection.process_data_events(time_limit=time_limit_s)
        except LOST as exc:
            raise feed_lost(exc) from exc
        finally:
            self._polling = False
        self._take_wakes()  # the caller looks at what woke it after this
        self._check_cancelled()

    def pump_until_wake(self, time_limit_s: float) -> None:
        """:meth:`pump` for a consumer with deliveries at hand and no handler slot free:
        take in what the broker sent without waiting for more, then wait up to
        ``time_limit_s`` for :meth:`wake` only (a queue between threads: much cheaper than
        a wake through pika's poll; the handler threads just started get going meanwhile)."""
        connection = self._connection
        assert connection is not None
        time_limit_s = self._send_acks(time_limit_s)
        try:
            connection.process_data_events(time_limit=0)
        except LOST as exc:
            raise feed_lost(exc) from exc
        self._check_cancelled()
        try:
            self._wakes.get(timeout=time_limit_s)
        except queue.Empty:
            return
        self._take_wakes()  # the caller looks at what woke it after this

    def _take_wakes(self) -> None:
        wakes = self._wakes
        while not wakes.empty():
            wakes.get_nowait()

    def _send_acks(self, time_limit_s: float) -> float:
        """Send the acks due; how long the feed thread may wait before the next ones are."""
        self.flush()
        acks = self._acks
        if acks.due:
            wait_s = acks.wait_s(time.monotonic())
            if wait_s is not None:
                return min(time_limit_s, wait_s)
        return time_limit_s

    def _check_cancelled(self) -> None:
        if self._cancelled:
            # Its queue went away, or a quorum queue lost its leader: nothing arrives
            # any more on this channel although it stays open.
            raise FeedLost(f"the broker cancelled the consumer of {self._queue}")

    def unsubscribe(self) -> None:
        channel = self.channel
        if channel is not None and channel.is_open and self._tag is not None:
            try:
                self._take_in()
                channel.basic_cancel(self._tag)
            except CLIENT_ERRORS as exc:
                log.debug("cancel failed: %r", exc)
        self._tag = None

    def _take_in(self) -> None:
        """Hand over what the broker sent before a cancel: pika's ``basic_cancel`` gives
        back (unsettled: a quorum queue charges it) a delivery read but not handed over,
        and :meth:`pump_until_wake` leaves the socket unread while it waits."""
        assert self._connection is not None
        self._connection.process_data_events(time_limit=0)

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
            self.flush(waited=True)  # no ack waits out the pause
            try:
                self._connection.sleep(seconds)  # keeps heartbeats flowing
            except LOST as exc:
                raise feed_lost(exc) from exc

    def wake(self) -> None:
        """Wake the feed thread (from any thread): it waits for :attr:`_wakes`, or in pika's
        poll while :meth:`pump` waits for the broker too. No wake is lost: the feed thread
        sets ``_polling`` before it looks at ``_wakes``, and this puts before it looks at
        ``_polling``."""
        self._wakes.put(None)
        if not self._polling:
            return
        connection = self._connection
        if connection is not None:
            try:
                connection.add_callback_threadsafe(_nothing)
            except Exception:  # closed meanwhile: the pump polls anyway
                pass

    def close(self) -> None:
        """Send the acks due, cancel consuming (unacked deliveries go back to the queue)
        and close."""
        if self.channel is not None and self.channel.is_open:
            self._send_last_acks()
            self.unsubscribe()
        close_quietly(self.channel)
        close_quietly(self._connection)
        self.channel = None
        self._connection = None
        self._tag = None
        self._acks = AckLine()

    def _send_last_acks(self) -> None:
        """Every ack marked goes now, however it waits (a stop's last handlers)."""
        try:
            self.flush(waited=True)
        except FeedLost as exc:  # lost meanwhile: the broker has them back
            log.debug("sending the last acks failed: %s", exc)
        except CLIENT_ERRORS as exc:
            log.debug("sending the last acks failed: %r", exc)
