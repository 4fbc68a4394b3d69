"""The asyncio consumer: performs what the delivery planner decides.

See :class:`~delayq.consume.planner.DeliveryPlanner`.

Each delivery ends in exactly one of: done, duplicate skipped, retried later
(republished to a retry tier addressed to this queue alone, confirmed, then
acked) or dead-lettered (republished to ``<queue>.dlq`` with the reason,
confirmed, then acked). If the republish cannot be confirmed the delivery is
returned to the queue instead: nothing is acked that is not safely elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

from delayq.aio._acks import AckCoalescer, ack_batch
from delayq.aio._flow import AsyncDeliveryFlow
from delayq.aio._handlers import HandlerRunner
from delayq.aio._stalls import watch_stalls
from delayq.aio._store import StoreBatcher
from delayq.aio.publisher import AsyncPublisher
from delayq.consume.handlers import is_coroutine_handler, plain
from delayq.consume.settings import RECONNECT_MAX_S, RECONNECT_MIN_S
from delayq.contexts import NoContext
from delayq.errors import InvalidInput
from delayq.links import AsyncFeed, FeedLost, open_async_feed
from delayq.stores.base import (
    IdempotencyStore,
)

__all__ = ["AsyncConsumer"]

log = logging.getLogger("delayq.consumer")

RECONNECT_STOP_S = 15.0
"""The longest :meth:`AsyncConsumer.stop` waits for a reconnect it cancelled to close
what it had opened (its shielded close: :func:`~delayq.aio._connection.close_shielded`)."""

Handler = Callable[..., Awaitable[Any]] | Callable[..., Any]
"""``handler(body)``, a coroutine function or a plain one; ``handler(body, tx)`` when
transactional."""
TransactionalHandler = Callable[[Any, Any], object]


class AsyncConsumer(NoContext, AsyncDeliveryFlow):
    """Runs ``handler`` for every message of ``queue``, with retries, a DLQ and dedup.

    >>> consumer = AsyncConsumer(url, topology, "orders.reminders", send_reminder,  # doctest: +SKIP
    ...                          policy=ExponentialBackoff(initial="30s", max_attempts=5),
    ...                          store=SQLiteStore("keys.db"), key=lambda order: order["id"])
    >>> await consumer.run()   # until SIGTERM/SIGINT, then a graceful stop  # doctest: +SKIP

    ``handler`` takes the decoded body (a ``model`` instance when ``model`` is
    given) and may be a coroutine function or a plain one (run in a thread; a
    plain function cannot be interrupted when it overruns ``handler_timeout``).
    ``feed`` replaces where deliveries come from, ``link`` what retries and dead
    letters are published through (see :mod:`delayq.links`).
    """

    _sync: ClassVar[bool] = False
    _name: ClassVar[str] = "AsyncConsumer"
    _instead: ClassVar[str] = (
        "call `await consumer.run()` (it stops on SIGTERM/SIGINT or request_stop()), "
        "or `await consumer.start()` and `await consumer.stop()`"
    )
    _feed: AsyncFeed

    def _open_feed(self, url: str) -> AsyncFeed:
        return open_async_feed(url)

    @property
    def inline(self) -> bool:
        """Whether the broker delivers while it runs (a memory broker): no watchdogs."""
        return self._feed.inline

    def _adapt(self, handler: Callable[..., Any], store: IdempotencyStore | None) -> None:
        self._is_async = is_coroutine_handler(handler)
        if self._transactional and self._is_async:
            raise InvalidInput(
                "a transactional handler is a plain function `handler(body, tx)` (its "
                "__call__ is a coroutine here): it runs in a thread with the transaction"
            )
        # A plain handler that returns a coroutine ran nothing: that fails the delivery.
        self._handler: Handler = handler if self._is_async else plain(handler)
        self._store = None if store is None else StoreBatcher(store)
        # The prefetch already bounds what runs at once; a semaphore only for less.
        limit = self._settings.concurrency
        prefetch = self._prefetch
        self._slots = asyncio.Semaphore(limit) if limit is not None and limit < prefetch else None
        self._cautious = False
        self._widening: asyncio.Task[None] | None = None
        self._runner = HandlerRunner(
            self._handler,
            is_async=self._is_async,
            transactional=self._transactional,
            store=self._store,
            timeout_ms=self._timeout_ms,
            threads=2 * (self._settings.concurrency or self._prefetch),
            clock_ms=self._clock_ms,
            queue=self.queue,
        )
        self._watchdog: asyncio.Task[None] | None = None
        self._stall_guard: asyncio.Task[None] | None = None
        self._arrivals = 0
        """Deliveries so far: the stall guard looks whether it moved."""
        self._pruner: asyncio.Task[None] | None = None
        self._publisher = AsyncPublisher(self._url, self.topology, **self._republisher_options())
        self._open_now = False
        self._in_flight: set[asyncio.Task[None]] = set()
        self._acks = AckCoalescer(ack_batch(self._prefetch))
        self._stopping = False
        self._reconnecting: asyncio.Task[None] | None = None
        self._lost_again = False
        """The feed a reconnect is opening was lost before the reconnect was over."""
        self._stopped = asyncio.Event()
        self._stop_wanted = False  # request_stop() before run() waits: kept until it does
        self._stop_requested: asyncio.Event | None = None
        self._run_loop: asyncio.AbstractEventLoop | None = None

    # Life cycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Declare the topology, then start taking deliveries.

        Raises :class:`~delayq.errors.ConnectionFailed` when the broker cannot be
        reached now; once started, a lost connection or channel is reopened in the
        background (back-off up to ``RECONNECT_MAX_S``) until :meth:`stop`. On an
        inline feed (a memory broker) ``await broker.advance_async(...)`` delivers.
        """
        self._stopping = False
        await self._open()
        self._stopped.clear()
        if self.inline:
            return
        self._watchdog = asyncio.create_task(self._runner.watch_timeouts())
        self._stall_guard = asyncio.create_task(
            watch_stalls(
                self.queue, lambda: self._arrivals, self._busy, self._feed.ready, self._on_lost
            )
        )
        if self._store is not None:
            self._pruner = asyncio.create_task(self._prune_forever())
        log.info("consuming %s (prefetch %d)", self.queue, self._prefetch)

    async def _open(self) -> None:
        # Cautious start: one delivery at a time while they are redeliveries, so a
        # message that crashes the process charges only itself to the quorum queue's
        # delivery count, not the prefetched ones behind it (see _widen_prefetch).
        self._cautious = self._prefetch > 1 and not self.inline
        on_delivery = self._run_inline if self.inline else self._on_delivery
        prefetch = 1 if self._cautious else self._prefetch
        self._acks = AckCoalescer(ack_batch(prefetch))  # delivery tags are per channel
        await self._feed.open(self.topology, self.queue, prefetch, on_delivery, self._on_lost)
        try:
            await self._publisher.connect()
        except BaseException:
            await self._feed.close()
            raise
        self._open_now = True

    def _on_lost(self, exc: BaseException) -> None:
        """The feed lost its broker: unless stopping, open it again."""
        if self._stopping:
            return
        if self._reconnecting is None or self._reconnecting.done():
            log.warning("lost the broker while consuming %s (%r); reconnecting", self.queue, exc)
            self._reconnecting = asyncio.get_running_loop().create_task(self._reconnect())
        else:  # the feed the reconnect opens: it goes round once more
            self._lost_again = True

    async def _let_go(self) -> None:
        """Give up the feed it has: the broker requeues what its channel did not ack."""
        self._open_now = False
        self._acks.abandon()
        await self._feed.close()

    async def _reconnect(self) -> None:
        delay = RECONNECT_MIN_S
        await self._let_go()
        while not self._stopping:
            self._lost_again = False
            try:
                await self._open()
                if self._lost_again:  # a dead feed is not a reconnect
                    await self._let_go()
                    raise ConnectionError("the broker closed the new connection at once")
            except Exception as exc:
                log.warning(
                    "reconnecting the consumer of %s failed (%s); next try in %.1f s",
                    self.queue,
                    exc,
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, RECONNECT_MAX_S)
                continue
            self.stats.reconnects += 1
            log.info("reconnected; consuming %s again", self.queue)
            return

    async def _prune_forever(self) -> None:
        """Forget keys past the retention period, every tenth of it (at most 10 min)."""
        assert self._store is not None
        while True:
            try:
                older_than = self._clock_ms() - self._settings.retention_ms
                await self._store.prune(older_than_ms=older_than)
            except Exception as exc:
                log.warning("pruning the idempotency store failed: %r", exc)
            await asyncio.sleep(self._settings.prune_every_ms / 1000)

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Stop taking deliveries, let in-flight ones finish (up to ``timeout_s``), close.

        In-flight handlers still running at the deadline are cancelled and their
        deliveries go back to the queue unacked, to be delivered again.
        """
        self._stopping = True
        reconnecting, self._reconnecting = self._reconnecting, None
        if reconnecting is not None and not reconnecting.done():
            # Cancelled, then waited for: a reconnect cut in the middle of opening the
            # feed closes what it opened (its topology connection too) here, not in the
            # event loop's teardown, where a second cancel could cut aio-pika's close.
            reconnecting.cancel()
            await asyncio.wait((reconnecting,), timeout=RECONNECT_STOP_S)
        if self._pruner is not None:
            self._pruner.cancel()
            self._pruner = None
        await self._feed.unsubscribe()
        if self._in_flight:
            _, pending = await asyncio.wait(self._in_flight, timeout=timeout_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=5)
        if self._runner.finishing:  # handler threads cut from their deliveries: record their keys
            await asyncio.wait(self._runner.finishing, timeout=timeout_s)
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._stall_guard is not None:
            self._stall_guard.cancel()
            self._stall_guard = None
        await self._acks.drain()
        self._runner.shutdown()
        await self._feed.close()
        self._open_now = False
        await self._publisher.aclose()
        if self._store is not None:
            await asyncio.to_thread(self._store.close)
        if self._observers:
            await asyncio.to_thread(self._observers.flush)
        self._stopped.set()

    async def run(self, *, install_signal_handlers: bool = True) -> None:
        """Consume until SIGTERM or SIGINT (or :meth:`request_stop`), then stop gracefully.

        Signal handlers are installed only in the main thread (and not with
        ``install_signal_handlers=False``); elsewhere :meth:`request_stop` stops it."""
        loop = asyncio.get_running_loop()
        stop_requested = asyncio.Event()
        self._stop_requested, self._run_loop = stop_requested, loop
        if self._stop_wanted:  # asked before run() began
            stop_requested.set()
        try:
            await self.start()
        except BaseException:
            self._stop_requested = self._run_loop = None
            self._stop_wanted = False
            raise
        # Only the main thread may handle signals; a loop in another one stops by
        # request_stop() alone, as the sync Consumer's run() there does.
        install_signal_handlers &= threading.current_thread() is threading.main_thread()
        if install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop_requested.set)
        try:
            await stop_requested.wait()
        finally:
            if install_signal_handlers:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
            await self.stop()
            self._stop_requested = self._run_loop = None
            self._stop_wanted = False

    def request_stop(self) -> None:
        """Ask :meth:`run` to stop gracefully, from the loop or any thread. A request made
        while :meth:`run` is starting, or before it began, is kept: ``run`` starts, then
        stops at once."""
        self._stop_wanted = True
        event, loop = self._stop_requested, self._run_loop
        if event is None or loop is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            event.set()
        else:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # the loop closed meanwhile: nothing to stop
                pass

    # Deliveries ---------------------------------------------------------------

    async def _widen_prefetch(self) -> None:
        """Leave the cautious start at the first fresh delivery: subscribe again with the
        full prefetch. The delivery in hand stays this channel's."""
        if self._stopping:
            return
        try:
            await self._feed.resubscribe(self._prefetch)
            self._acks.batch = ack_batch(self._prefetch)
        except FeedLost as exc:
            log.warning("widening the prefetch of %s failed (%s); reconnecting", self.queue, exc)
            self._on_lost(exc)

    def _busy(self) -> bool:
        """Whether a stall check must wait: deliveries in flight, closed, or reconnecting."""
        reconnecting = self._reconnecting is not None and not self._reconnecting.done()
        return bool(self._in_flight) or not self._open_now or reconnecting
