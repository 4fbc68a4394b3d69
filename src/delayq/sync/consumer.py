"""The blocking consumer (pika): performs what :class:`~delayq.delivery.DeliveryPlanner` decides.

Up to ``concurrency`` handlers run at once, each in a thread of its own
(:mod:`delayq.sync._threads`), while the consumer's own thread owns the pika
connection (not thread-safe): it keeps heartbeats flowing, receives deliveries,
enforces ``handler_timeout`` and does every store call, republish, ack and nack.
A handler that hangs holds one slot only: the others keep flowing.

After every (re)connect the consumer subscribes with a prefetch of 1 and keeps it
while the deliveries are redeliveries, widening to ``prefetch`` at the first
fresh one. A quorum queue charges every unacked delivery of a dead connection to
its ``x-delivery-count``, so a handler that crashes the process (a poison message)
charges only itself on each restart, not the messages prefetched behind it.
"""

from __future__ import annotations

import collections
import logging
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, ClassVar

import pika
import pika.exceptions as pex
from pika.adapters.blocking_connection import BlockingChannel

from delayq.delivery import (
    RECONNECT_MAX_S,
    RECONNECT_MIN_S,
    STALL_CHECK_S,
    Delivery,
    is_fresh,
)
from delayq.errors import DelayqError
from delayq.idempotency import IdempotencyStore
from delayq.sync._connection import (
    CONNECTION_ERRORS,
    close_quietly,
    connect,
    translate_channel_error,
)
from delayq.sync._deliveries import DeliveryFlow, Incoming
from delayq.sync._threads import HandlerThreads
from delayq.sync.ensure import ensure_topology
from delayq.sync.publisher import Publisher
from delayq.urls import resolved_memory_name

__all__ = ["DEFAULT_CONCURRENCY", "STOP_GRACE_S", "Consumer"]

DEFAULT_CONCURRENCY = 8
"""Handler threads of a :class:`Consumer` when ``concurrency`` is not given (or
``prefetch`` if smaller): one hung handler leaves 7 others flowing, and a worker
with a consumer per queue stays at tens of threads, not hundreds."""

STOP_GRACE_S = 30.0
"""On a graceful stop, prefetched deliveries still start for this long (as
:meth:`AsyncConsumer.stop <delayq.aio.AsyncConsumer.stop>` waits for them);
running handlers finish or reach their ``handler_timeout``."""


class _ChannelSettler:
    """Settles a delivery on the channel it came on, while that is the consumer's."""

    __slots__ = ("_channel", "_consumer", "_tag")

    def __init__(self, consumer: Consumer, channel: Any, tag: int) -> None:
        self._consumer, self._channel, self._tag = consumer, channel, tag

    @property
    def current(self) -> bool:
        return self._channel is self._consumer._channel

    def ack(self) -> None:
        self._channel.basic_ack(self._tag)

    def requeue(self) -> None:
        self._channel.basic_nack(self._tag, requeue=True)


class StalledConsumer(Exception):
    """The queue holds ready messages but the broker delivers none: subscribe again."""


class ConsumerCancelled(Exception):
    """The broker cancelled the consumer (its queue went away, a quorum queue lost its
    leader): subscribe again on a fresh connection."""


LOST: tuple[type[BaseException], ...] = (
    *CONNECTION_ERRORS,
    StalledConsumer,
    ConsumerCancelled,
    pex.ChannelClosed,  # e.g. closed by the broker past its consumer_timeout
    pex.ChannelWrongStateError,
)
"""Errors after which the consumer reopens its connection and channel."""

log = logging.getLogger("delayq.consumer")


class Consumer(DeliveryFlow):
    """Runs ``handler`` for every message of ``queue``, with retries, a DLQ and dedup.

    >>> consumer = Consumer(url, topology, "orders.reminders", send_reminder,  # doctest: +SKIP
    ...                     policy=ExponentialBackoff(initial="30s", max_attempts=5),
    ...                     store=SQLiteStore("keys.db"), key=lambda order: order["id"])
    >>> consumer.run()   # until SIGTERM/SIGINT, then a graceful stop  # doctest: +SKIP

    The same arguments, decisions and headers as :class:`~delayq.aio.AsyncConsumer`.
    Up to ``concurrency`` handlers (default :data:`DEFAULT_CONCURRENCY`, at most
    ``prefetch``) run at once in threads, so the handler must be thread-safe; pass
    ``concurrency=1`` for one at a time. A handler that overruns ``handler_timeout``
    is retried; its thread cannot be killed and is left to finish on its own while
    the consumer goes on with its slot (at most ``concurrency`` such threads
    beyond the working ones; then no handler starts until one of them ends).
    """

    def __new__(cls, url: str | None = None, *args: Any, **kwargs: Any) -> Consumer:
        if cls is Consumer and resolved_memory_name(url) is not None:
            from delayq.testing.sync import MemoryConsumer

            return super().__new__(MemoryConsumer)
        return super().__new__(cls)

    _name: ClassVar[str] = "Consumer"

    def _adapt(self, handler: Callable[..., Any], store: IdempotencyStore | None) -> None:
        super()._adapt(handler, store)
        self.concurrency = self._settings.concurrency or min(self._prefetch, DEFAULT_CONCURRENCY)
        """Handlers running at once, at most."""
        self._next_prune = 0.0
        self._stop_grace_s = STOP_GRACE_S
        self._publisher = Publisher(self._url, self.topology, clock_ms=self._clock_ms)
        self._connection: pika.BlockingConnection | None = None
        self._channel: BlockingChannel | None = None
        self._consumer_tag: str | None = None
        self._cautious = False
        self._widen = False
        self._cancelled = False
        self._pending: collections.deque[Incoming] = collections.deque()
        self._threads = self._new_threads()
        self._fatal: BaseException | None = None
        self._stop = threading.Event()
        self.started = threading.Event()

    def _pause_before_requeue(self) -> None:
        if self._connection is not None:
            self._connection.sleep(self._return_pause_s)  # keeps heartbeats flowing

    def _new_threads(self) -> HandlerThreads:
        return HandlerThreads(
            self.concurrency,
            spare=self.concurrency,
            timeout_s=self._timeout_ms / 1000,
            name="delayq-handler",
            wake=self._wake,
        )

    def _wake(self) -> None:
        """From a handler thread: make the connection's thread look at finished jobs now."""
        connection = self._connection
        if connection is not None:
            try:
                connection.add_callback_threadsafe(lambda: None)
            except Exception:  # closed meanwhile: the loop polls anyway
                pass

    # Life cycle ---------------------------------------------------------------

    def start(self) -> None:
        """Declare the topology and open the consuming channel.

        Raises :class:`~delayq.errors.ConnectionFailed` when the broker cannot be
        reached now; once running, a lost connection or channel is reopened (back-off
        up to ``RECONNECT_MAX_S``) until a stop is requested.
        """
        self._stop.clear()
        self._fatal = None
        self._open()
        self.started.set()
        log.info(
            "consuming %s (prefetch %d, %d handlers at once)",
            self.queue,
            self._prefetch,
            self.concurrency,
        )

    def _open(self) -> None:
        connection = connect(self._url, name=f"delayq-consumer {self.queue}")
        try:
            ensure_topology(self.topology, connection)  # or check it, if refused
            self._publisher.connect()
            channel = connection.channel()
            channel.add_on_cancel_callback(self._on_cancelled)
            # Cautious start (see the module's docstring): one delivery at a time until
            # the first fresh one.
            self._cautious = self._prefetch > 1
            self._widen = self._cancelled = False
            channel.basic_qos(prefetch_count=1 if self._cautious else self._prefetch)
            try:
                tag = channel.basic_consume(self.queue, self._on_message)
            except pex.ChannelClosedByBroker as exc:  # may not read it (see delayq.grants)
                raise translate_channel_error(exc) from exc
        except BaseException:
            close_quietly(connection)
            raise
        self._connection, self._channel, self._consumer_tag = connection, channel, tag

    def _on_message(
        self, channel: Any, method: Any, props: pika.BasicProperties, body: bytes
    ) -> None:
        delivery = Delivery(
            queue=self.queue,
            body=body,
            routing_key=method.routing_key or "",
            message_id=props.message_id,
            content_type=props.content_type,
            headers=props.headers or {},
            redelivered=bool(method.redelivered),
        )
        self._pending.append((_ChannelSettler(self, channel, method.delivery_tag), delivery))
        self._last_delivery = time.monotonic()
        if self._cautious and is_fresh(delivery.redelivered, delivery.headers):
            self._widen = True

    def _on_cancelled(self, _frame: Any) -> None:
        self._cancelled = True

    def _widen_prefetch(self) -> None:
        """Leave the cautious start: subscribe again with the full prefetch. A
        consumer's prefetch cannot change once it consumes, and quorum queues refuse a
        channel-wide one; the delivery in hand stays this channel's to ack."""
        self._widen = self._cautious = False
        channel = self._channel
        assert channel is not None and self._consumer_tag is not None
        channel.basic_cancel(self._consumer_tag)
        channel.basic_qos(prefetch_count=self._prefetch)
        self._consumer_tag = channel.basic_consume(self.queue, self._on_message)

    def request_stop(self) -> None:
        """Stop gracefully (safe from any thread or a signal handler): no new deliveries,
        running handlers finish, prefetched ones are handled for up to :data:`STOP_GRACE_S`."""
        self._stop.set()

    def run(self, *, install_signal_handlers: bool = True) -> None:
        """Consume until SIGTERM or SIGINT (or :meth:`request_stop`), then stop gracefully.

        Signal handlers can only be installed from the main thread. A handler that
        raises ``SystemExit``, ``KeyboardInterrupt`` or another ``BaseException`` that is
        not an ``Exception`` stops the consumer gracefully; ``run`` then raises it, and
        that delivery goes back to the queue unacked.
        """
        previous: dict[int, Any] = {}
        if install_signal_handlers:

            def on_signal(signum: int, frame: FrameType | None) -> None:
                self.request_stop()

            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, on_signal)
        try:
            if self._channel is None:
                self.start()
            while True:
                try:
                    self._serve()
                    break
                except LOST as exc:
                    if isinstance(exc, pex.ChannelClosedByBroker) and exc.reply_code == 403:
                        # May not consume: reconnecting cannot help (see delayq.grants).
                        raise translate_channel_error(exc) from exc
                    if self._stop.is_set():
                        break
                    log.warning(
                        "lost the broker while consuming %s (%r); reconnecting", self.queue, exc
                    )
                self._reconnect()
        finally:
            for signum, old_handler in previous.items():
                signal.signal(signum, old_handler)
            self.close()
        if self._fatal is not None:
            raise self._fatal

    def _serve(self) -> None:
        """The connection thread's loop: deliveries in, handlers started, outcomes settled."""
        assert self._connection is not None
        tick_s = max(0.005, min(0.2, self._timeout_ms / 10_000))
        self._last_delivery = time.monotonic()
        stop_by: float | None = None
        while True:
            self._connection.process_data_events(time_limit=tick_s)
            self._settle_finished()
            self._time_out_overruns()
            if self._cancelled:
                raise ConsumerCancelled(f"the broker cancelled the consumer of {self.queue}")
            if self._stop.is_set():
                if stop_by is None:
                    stop_by = time.monotonic() + self._stop_grace_s
                    self._unsubscribe()
                if time.monotonic() >= stop_by:
                    self._pending.clear()  # back to the queue when the channel closes
                if not self._pending and not self._threads.running:
                    return
            elif self._widen:
                self._widen_prefetch()
            self._start_pending()
            self._prune_when_due()
            self._check_stalled()

    def _unsubscribe(self) -> None:
        channel = self._channel
        if channel is not None and channel.is_open and self._consumer_tag is not None:
            try:
                channel.basic_cancel(self._consumer_tag)
            except (pex.AMQPError, OSError) as exc:
                log.debug("cancel failed: %r", exc)
        self._consumer_tag = None

    def _check_stalled(self) -> None:
        if self._pending or self._threads.running or self._stop.is_set():
            return
        if time.monotonic() - self._last_delivery < STALL_CHECK_S:
            return
        self._last_delivery = time.monotonic()
        if self._stalled():
            raise StalledConsumer(f"messages ready in {self.queue} but none delivered")

    def _stalled(self) -> bool:
        """Ready messages, none delivered for a while (see AsyncConsumer._watch_stalls)."""
        assert self._connection is not None
        probe = self._connection.channel()
        try:
            ok = probe.queue_declare(self.queue, passive=True)
            return int(ok.method.message_count) > 0
        finally:
            close_quietly(probe)

    def _reconnect(self) -> None:
        close_quietly(self._channel)
        close_quietly(self._connection)
        self._channel = self._connection = None
        self._consumer_tag = None
        self._pending.clear()  # the broker gives them back
        delay = RECONNECT_MIN_S
        while not self._stop.is_set():
            try:
                self._open()
            except DelayqError as exc:
                log.warning(
                    "reconnecting the consumer of %s failed (%s); next try in %.1f s",
                    self.queue,
                    exc,
                    delay,
                )
                self._stop.wait(delay)
                delay = min(delay * 2, RECONNECT_MAX_S)
                continue
            self.stats.reconnects += 1
            log.info("reconnected; consuming %s again", self.queue)
            return

    def close(self) -> None:
        """Cancel consuming (unacked deliveries go back to the queue) and close."""
        channel = self._channel
        if channel is not None and channel.is_open:
            self._unsubscribe()
        close_quietly(channel)
        close_quietly(self._connection)
        self._channel = None
        self._connection = None
        self._pending.clear()
        self._publisher.close()
        for job in self._threads.forget_running():
            log.warning(
                "handler of %s still running at close; its claim lapses with its lease",
                job.delivery.message_id,
            )
        self._threads.close()
        self._threads = self._new_threads()
        self._observers.flush()
        self.started.clear()
