"""The blocking consumer: performs what :class:`~delayq.consume.planner.DeliveryPlanner` decides.

Deliveries come from a feed (:mod:`delayq.links`; pika's by default,
:mod:`delayq.sync._feed`). Up to ``concurrency`` handlers run at once, each in a
thread of its own (:mod:`delayq.sync._threads`), while the consumer's own thread
owns the feed (pika's connection is not thread-safe): it keeps heartbeats flowing,
receives deliveries, enforces ``handler_timeout`` and does every store call,
republish, ack and nack. On an inline feed (a memory broker) the broker delivers
in the caller's thread and the handler runs there, with no timeout.
A handler that hangs holds one slot only: the others keep flowing.

Handing work between threads costs more than a no-op handler: a handler's end
wakes the consumer's thread only when nothing else has since it last looked, and
pika's feed acks settled deliveries together, a ``multiple`` ack at a time, never
past one that is not settled (:mod:`delayq.sync._acks`).

After every (re)connect the consumer subscribes with a prefetch of 1 and keeps it
while the deliveries are redeliveries, widening to ``prefetch`` at the first
fresh one. A quorum queue charges every unacked delivery of a dead connection to
its ``x-delivery-count``, so a handler that crashes the process (a poison message)
charges only itself on each restart, not the messages prefetched behind it.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

from delayq.consume.delivery import Delivery, is_fresh
from delayq.consume.settings import RECONNECT_MAX_S, RECONNECT_MIN_S, STALL_CHECK_S
from delayq.contexts import NoContext
from delayq.errors import DelayqError, HandlersStuck
from delayq.links import Feed, FeedLost, Settler, open_feed
from delayq.observe.logs import bound_delivery
from delayq.stores.base import IdempotencyStore
from delayq.sync._deliveries import SPARE_PER_SLOT, DeliveryFlow, Incoming
from delayq.sync._signals import stopping_on_signals
from delayq.sync._threads import HandlerThreads
from delayq.sync.publisher import Publisher

__all__ = ["DEFAULT_CONCURRENCY", "STOP_GRACE_S", "Consumer"]

DEFAULT_CONCURRENCY = 8
"""Handler threads of a :class:`Consumer` when ``concurrency`` is not given (or
``prefetch`` if smaller): one hung handler leaves 7 others flowing, and a worker
with a consumer per queue stays at tens of threads, not hundreds."""

STOP_GRACE_S = 30.0
"""On a graceful stop, prefetched deliveries still start for this long (as
:meth:`AsyncConsumer.stop <delayq.aio.AsyncConsumer.stop>` waits for them);
running handlers finish or reach their ``handler_timeout``."""

log = logging.getLogger("delayq.consumer")


class Consumer(NoContext, DeliveryFlow):
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
    a new thread takes its slot (at most ``2 * concurrency`` such threads beyond the
    working ones; then no handler starts until one of them ends). A message with two
    attempts hanging so is not run a third time beside them (the attempt fails as a
    timeout): so handlers that hang on every attempt of up to ``concurrency``
    messages leave the full concurrency to the others.
    ``feed`` replaces where deliveries come from, ``link`` what retries and dead
    letters are published through (see :mod:`delayq.links`).
    """

    _name: ClassVar[str] = "Consumer"
    _instead: ClassVar[str] = (
        "call consumer.run() (it stops on SIGTERM/SIGINT or request_stop()), or "
        "consumer.start() and consumer.close()"
    )
    _feed: Feed

    def _open_feed(self, url: str) -> Feed:
        return open_feed(url)

    def _adapt(self, handler: Callable[..., Any], store: IdempotencyStore | None) -> None:
        super()._adapt(handler, store)
        self.concurrency = self._settings.concurrency or min(self._prefetch, DEFAULT_CONCURRENCY)
        """Handlers running at once, at most."""
        self._stop_grace_s = STOP_GRACE_S
        self._publisher = Publisher(self._url, self.topology, **self._republisher_options())
        self._open_now = False
        self._cautious = False
        self._widen = False
        self._last_delivery = 0.0
        self._pending: collections.deque[Incoming] = collections.deque()
        self._threads = self._new_threads()
        self._fatal: BaseException | None = None
        self._stop = threading.Event()
        self.started = threading.Event()

    @property
    def inline(self) -> bool:
        """Whether handlers run in the broker's thread as it delivers (a memory broker)."""
        return self._feed.inline

    def _pause_before_requeue(self) -> None:
        self._feed.sleep(self._return_pause_s)  # a real feed keeps heartbeats flowing

    def _new_threads(self) -> HandlerThreads:
        return HandlerThreads(
            self.concurrency,
            spare=SPARE_PER_SLOT * self.concurrency,
            timeout_s=self._timeout_ms / 1000,
            name="delayq-handler",
            wake=self._feed.wake,  # a handler thread ended: look at it now
        )

    # Life cycle ---------------------------------------------------------------

    def start(self) -> None:
        """Declare the topology and start taking deliveries.

        Raises :class:`~delayq.errors.ConnectionFailed` when the broker cannot be
        reached now; once running, a lost connection or channel is reopened (back-off
        up to ``RECONNECT_MAX_S``) until a stop is requested.
        """
        self._fatal = None  # a stop requested before start is kept (close() forgets it)
        self._open()
        self.started.set()
        log.info(
            "consuming %s (prefetch %d, %d handlers at once)",
            self.queue,
            self._prefetch,
            self.concurrency,
        )

    def _open(self) -> None:
        # Cautious start (see the module's docstring): one delivery at a time until
        # the first fresh one.
        self._cautious = self._prefetch > 1 and not self.inline
        self._widen = False
        on_delivery = self._run_inline if self.inline else self._arrived
        prefetch = 1 if self._cautious else self._prefetch
        self._feed.open(self.topology, self.queue, prefetch, on_delivery)
        try:
            self._publisher.connect()
        except BaseException:
            self._feed.close()
            raise
        self._open_now = True

    def _arrived(self, settler: Settler, delivery: Delivery) -> None:
        self._pending.append((settler, delivery))
        self._last_delivery = time.monotonic()
        if self._cautious and is_fresh(delivery.redelivered, delivery.headers):
            self._widen = True

    def _run_inline(self, settler: Settler, delivery: Delivery) -> None:
        """An inline feed's delivery: the whole flow here, the handler included."""
        self._prune_when_due()
        job = self._begin(settler, delivery)
        if job is not None:
            job.run()
            with bound_delivery(job.delivery):
                self._finish(job)
        if self._fatal is not None:
            fatal, self._fatal = self._fatal, None
            raise fatal

    def _widen_prefetch(self) -> None:
        """Leave the cautious start: subscribe again with the full prefetch (the
        delivery in hand stays this channel's to ack)."""
        self._widen = self._cautious = False
        self._feed.resubscribe(self._prefetch)

    def request_stop(self) -> None:
        """Stop gracefully (safe from any thread or a signal handler): no new deliveries,
        running handlers finish, prefetched ones are handled for up to :data:`STOP_GRACE_S`.
        A request made while :meth:`run` is starting, or before it began, is kept: ``run``
        starts, then stops at once."""
        self._stop.set()

    def run(self, *, install_signal_handlers: bool = True) -> None:
        """Consume until SIGTERM or SIGINT (or :meth:`request_stop`), then stop gracefully.

        Signal handlers are installed only in the main thread (and not with
        ``install_signal_handlers=False``); in another thread ``run`` consumes all the same
        and :meth:`request_stop`, from any thread, stops it. A handler that
        raises ``SystemExit``, ``KeyboardInterrupt`` or another ``BaseException`` that is
        not an ``Exception`` stops the consumer gracefully; ``run`` then raises it, and
        that delivery goes back to the queue unacked. On an inline feed (a memory
        broker) ``run`` only starts the consumer: the broker's ``advance`` runs it.
        """
        if self.inline:
            if not self._open_now:
                self.start()
            return
        with stopping_on_signals(self.request_stop, install=install_signal_handlers):
            try:
                if not self._open_now:
                    self.start()
                while True:
                    try:
                        self._serve()
                        break
                    except FeedLost as exc:
                        if self._stop.is_set():
                            break
                        log.warning(
                            "lost the broker while consuming %s (%s); reconnecting",
                            self.queue,
                            exc,
                        )
                    self._reconnect()
            finally:
                self.close()
        if self._fatal is not None:
            raise self._fatal

    def _serve(self) -> None:
        """The feed thread's loop: deliveries in, handlers started, outcomes settled."""
        tick_s = max(0.005, min(0.2, self._timeout_ms / 10_000))
        self._last_delivery = time.monotonic()
        stop_by: float | None = None
        feed, threads = self._feed, self._threads
        # With deliveries at hand and every slot busy, only a handler's end matters: a
        # feed that can wait for that alone (pika's) reads without waiting, then does.
        until_wake: Callable[[float], None] | None = getattr(feed, "pump_until_wake", None)
        while True:
            if until_wake is not None and self._pending and not threads.free():
                until_wake(tick_s)
            else:
                feed.pump(tick_s)
            self._settle_finished()
            self._time_out_overruns()
            self._watch_stuck()
            if self._stop.is_set():
                if stop_by is None:
                    stop_by = time.monotonic() + self._stop_grace_s
                    self._feed.unsubscribe()
                if time.monotonic() >= stop_by:
                    self._pending.clear()  # back to the queue when the channel closes
                if not self._pending and not threads.unsettled():
                    return  # nothing started is left unsettled (ended, not taken yet)
            elif self._widen:
                self._widen_prefetch()
            self._start_pending()
            self._prune_when_due()
            self._check_stalled()

    def _watch_stuck(self) -> None:
        """Say loudly when no handler can start (every thread stuck past its timeout),
        and give up after ``stuck_grace``: only a fresh process ends a stuck thread."""
        threads = self._threads
        self.stats.stuck_handlers = threads.abandoned
        since = self.stats.stuck_since
        if not threads.stuck():
            if since is not None:
                self.stats.stuck_since = None
                log.warning("a stuck handler of %s returned: handlers start again", self.queue)
            return
        now = time.monotonic()
        grace_ms = self._settings.stuck_grace_ms
        timeout_s = self._timeout_ms / 1000
        if since is None:
            self.stats.stuck_since = since = now
            log.error(
                "every handler thread of the consumer of %s (%d) is stuck in a handler past "
                "handler_timeout (%g s): no handler can start until one returns; deliveries "
                "whose previous attempt timed out go to the DLQ, the others wait%s",
                self.queue,
                threads.abandoned,
                timeout_s,
                "" if grace_ms is None else f" (stopping in {grace_ms / 1000:g} s: stuck_grace)",
            )
        if grace_ms is not None and (now - since) * 1000 >= grace_ms:
            raise HandlersStuck(
                f"every handler thread of the consumer of {self.queue!r} "
                f"({threads.abandoned}) was stuck in a handler past handler_timeout "
                f"({timeout_s:g} s) for {grace_ms / 1000:g} s (stuck_grace): stopped, its "
                "deliveries back in the queue; start a fresh process (a stuck thread ends "
                "only with it) and make the handler return within its timeout"
            )

    def _check_stalled(self) -> None:
        """Ready messages, none delivered for a while: subscribe again (a consumer the
        broker forgot without telling, see AsyncConsumer._watch_stalls)."""
        if self._pending or self._threads.unsettled() or self._stop.is_set():
            return
        if time.monotonic() - self._last_delivery < STALL_CHECK_S:
            return
        self._last_delivery = time.monotonic()
        if self._feed.ready() > 0:
            raise FeedLost(f"messages ready in {self.queue} but none delivered")

    def _reconnect(self) -> None:
        self._feed.close()
        self._open_now = False
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
        """Stop consuming (unacked deliveries go back to the queue) and close."""
        self._feed.close()
        self._open_now = False
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
        self._stop.clear()  # served: the next run starts afresh
