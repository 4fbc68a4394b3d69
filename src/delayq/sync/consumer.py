"""The blocking consumer (pika): performs what :class:`~delayq.delivery.DeliveryPlanner` decides.

One handler runs at a time, in a worker thread, while the consumer's own thread
keeps the connection alive (heartbeats) and enforces ``handler_timeout``. For
parallel handlers run several consumers (processes, or threads each with its
own ``Consumer``), or use :class:`~delayq.aio.AsyncConsumer`.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import functools
import inspect
import logging
import random
import signal
import threading
import time
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any, cast

import pika
import pika.exceptions as pex
from pika.adapters.blocking_connection import BlockingChannel
from pydantic import BaseModel

from delayq.delivery import (
    RECONNECT_MAX_S,
    RECONNECT_MIN_S,
    STALL_CHECK_S,
    ConsumeSettings,
    Decision,
    Delivery,
    DeliveryPlanner,
    Undecodable,
    decode_body,
    idempotency_key,
)
from delayq.envelope import epoch_ms
from delayq.errors import DelayqError, HandlerTimeout, InvalidInput, StoreError
from delayq.idempotency import (
    Claim,
    ClaimStatus,
    Complete,
    IdempotencyStore,
    Release,
    TransactionalStore,
    call_in_transaction,
    check_transactional,
    run_ops,
    store_error,
)
from delayq.key_scope import KeyScope
from delayq.logcontext import bound_delivery
from delayq.observe import DeliveryObserver, Observers, monotonic_ms
from delayq.retry import RetryPolicy
from delayq.stats import ConsumerStats
from delayq.sync._connection import CONNECTION_ERRORS, close_quietly, connect
from delayq.sync.provision import apply_topology
from delayq.sync.publisher import Publisher
from delayq.topology import Topology
from delayq.urls import redact, resolve_url, resolved_memory_name

__all__ = ["Consumer"]


class StalledConsumer(Exception):
    """The queue holds ready messages but the broker delivers none: subscribe again."""


LOST: tuple[type[BaseException], ...] = (
    *CONNECTION_ERRORS,
    StalledConsumer,
    pex.ChannelClosed,  # e.g. closed by the broker past its consumer_timeout
    pex.ChannelWrongStateError,
)
"""Errors after which the consumer reopens its connection and channel."""

log = logging.getLogger("delayq.consumer")


class Consumer:
    """Runs ``handler`` for every message of ``queue``, with retries, a DLQ and dedup.

    >>> consumer = Consumer(url, topology, "orders.reminders", send_reminder,  # doctest: +SKIP
    ...                     policy=ExponentialBackoff(initial="30s", max_attempts=5),
    ...                     store=SQLiteStore("keys.db"), key=lambda order: order["id"])
    >>> consumer.run()   # until SIGTERM/SIGINT, then a graceful stop  # doctest: +SKIP

    The same arguments, decisions and headers as :class:`~delayq.aio.AsyncConsumer`.
    A handler that overruns ``handler_timeout`` is retried; its thread cannot be
    killed and is left to finish on its own while the consumer goes on.
    """

    def __new__(cls, url: str | None = None, *args: Any, **kwargs: Any) -> Consumer:
        if cls is Consumer and resolved_memory_name(url) is not None:
            from delayq.testing.sync import MemoryConsumer

            return super().__new__(MemoryConsumer)
        return super().__new__(cls)

    def __init__(
        self,
        url: str | None,
        topology: Topology,
        queue: str,
        handler: Callable[..., Any],
        *,
        policy: RetryPolicy | None = None,
        store: IdempotencyStore | None = None,
        key: Callable[[Any], str] | None = None,
        key_scope: KeyScope | str = KeyScope.QUEUE,
        model: type[BaseModel] | None = None,
        prefetch: int = 50,
        handler_timeout: object = "5m",
        lease: object = None,
        retention: object = "7d",
        non_retryable: tuple[type[BaseException], ...] = (),
        transactional: bool = False,
        observers: Iterable[DeliveryObserver] = (),
        clock_ms: Callable[[], int] = epoch_ms,
        rng: random.Random | None = None,
    ) -> None:
        if inspect.iscoroutinefunction(handler):
            raise InvalidInput("handler is a coroutine function: use delayq.aio.AsyncConsumer")
        if transactional:
            check_transactional(store, handler)
        settings = ConsumeSettings.parse(
            prefetch=prefetch, handler_timeout=handler_timeout, lease=lease, retention=retention
        )
        self._url = resolve_url(url)
        self.topology = topology
        self.queue = queue
        self._handler = handler
        self._planner = DeliveryPlanner(
            topology,
            queue,
            policy=policy,
            non_retryable=non_retryable,
            clock_ms=clock_ms,
            rng=rng,
        )
        self._store = store
        self._transactional = transactional
        self._key = key
        self._key_scope = KeyScope.parse(key_scope)
        self._model = model
        self._prefetch = prefetch
        self._timeout_ms = settings.handler_timeout_ms
        self._lease_ms = settings.lease_ms
        self._settings = settings
        self._next_prune = 0.0
        self._return_pause_s = 1.0
        self._clock_ms = clock_ms
        self._publisher = Publisher(self._url, topology, clock_ms=clock_ms)
        self._connection: pika.BlockingConnection | None = None
        self._channel: BlockingChannel | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="delayq-handler")
        self._stop = threading.Event()
        self.started = threading.Event()
        self.stats = ConsumerStats()
        self._observers = Observers(observers)

    def __repr__(self) -> str:
        return f"Consumer(url={redact(self._url)!r}, queue={self.queue!r})"

    # Life cycle ---------------------------------------------------------------

    def start(self) -> None:
        """Declare the topology and open the consuming channel.

        Raises :class:`~delayq.errors.ConnectionFailed` when the broker cannot be
        reached now; once running, a lost connection or channel is reopened (back-off
        up to ``RECONNECT_MAX_S``) until a stop is requested.
        """
        self._stop.clear()
        self._open()
        self.started.set()
        log.info("consuming %s (prefetch %d)", self.queue, self._prefetch)

    def _open(self) -> None:
        connection = connect(self._url, name=f"delayq-consumer {self.queue}")
        try:
            apply_topology(self.topology, connection=connection)
            self._publisher.connect()
            channel = connection.channel()
            channel.basic_qos(prefetch_count=self._prefetch)
        except BaseException:
            close_quietly(connection)
            raise
        self._connection, self._channel = connection, channel

    def request_stop(self) -> None:
        """Stop after the delivery in hand (safe from any thread or a signal handler)."""
        self._stop.set()

    def run(self, *, install_signal_handlers: bool = True) -> None:
        """Consume until SIGTERM or SIGINT (or :meth:`request_stop`), then stop gracefully.

        Signal handlers can only be installed from the main thread.
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
            while not self._stop.is_set():
                try:
                    self._consume()
                    if self._stop.is_set():
                        break
                    # The generator ended by itself: the broker cancelled the consumer
                    # (its queue went away or restarted, a quorum queue losing its leader).
                    log.warning("the broker cancelled the consumer of %s; reconnecting", self.queue)
                except LOST as exc:
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

    def _consume(self) -> None:
        assert self._channel is not None
        last_delivery = time.monotonic()
        for method, props, body in self._channel.consume(self.queue, inactivity_timeout=0.2):
            if method is not None:
                self._process(method, props, body)
                last_delivery = time.monotonic()
            if self._stop.is_set():
                return
            self._prune_when_due()
            if time.monotonic() - last_delivery >= STALL_CHECK_S:
                last_delivery = time.monotonic()
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
            try:
                channel.cancel()  # requeues what was prefetched but not handled
            except (pex.AMQPError, OSError) as exc:
                log.debug("cancel failed: %r", exc)
        close_quietly(channel)
        close_quietly(self._connection)
        self._channel = None
        self._connection = None
        self._publisher.close()
        self._pool.shutdown(wait=False)
        self._observers.flush()
        self.started.clear()

    def _prune_when_due(self) -> None:
        """Forget keys past the retention period, every tenth of it (at most 10 min)."""
        if self._store is None or time.monotonic() < self._next_prune:
            return
        self._next_prune = time.monotonic() + self._settings.prune_every_ms / 1000
        try:
            try:
                self._store.prune(older_than_ms=self._clock_ms() - self._settings.retention_ms)
            except Exception as exc:
                raise store_error(self._store, exc) from exc
        except StoreError as exc:
            log.warning("pruning the idempotency store failed: %r", exc)

    # Deliveries ---------------------------------------------------------------

    def _process(self, method: Any, props: pika.BasicProperties, body: bytes) -> None:
        received_ms = self._clock_ms()
        delivery = Delivery(
            queue=self.queue,
            body=body,
            routing_key=method.routing_key or "",
            message_id=props.message_id,
            content_type=props.content_type,
            headers=props.headers or {},
            redelivered=bool(method.redelivered),
        )
        with bound_delivery(delivery):
            self._handle(method.delivery_tag, delivery, received_ms)

    def _handle(self, tag: int, delivery: Delivery, received_ms: int) -> None:
        try:
            value = decode_body(delivery, self._model)
            key = idempotency_key(
                value, delivery, self._key, required=self._transactional, scope=self._key_scope
            )
        except Undecodable as exc:
            decision = self._planner.undecodable(delivery, exc)
            self._perform(tag, decision, delivery, received_ms)
            return
        store = self._store if key is not None else None
        claim = Claim(key or "", self._lease_ms, self._clock_ms())
        if store is not None:
            try:
                status = run_ops(store, [claim])[0]
            except StoreError as exc:
                self._return(tag, delivery.message_id, f"claiming its key failed: {exc}")
                return
            if status is ClaimStatus.DONE:
                decision = self._planner.duplicate()
                self._perform(tag, decision, delivery, received_ms)
                return
            if status is ClaimStatus.BUSY:
                decision = self._planner.deferred(delivery)
                self._perform(tag, decision, delivery, received_ms)
                return
        started = monotonic_ms()
        try:
            self._call_handler(value, claim)
        except Exception as exc:
            if store is not None:
                try:
                    run_ops(store, [Release(claim.key)])
                except StoreError as release_error:  # the claim's lease ends by itself
                    log.warning("releasing key %r failed: %s", claim.key, release_error)
            decision = self._planner.failure(delivery, exc)
            self._perform(tag, decision, delivery, received_ms, monotonic_ms() - started)
            return
        if store is not None and not self._transactional:
            try:
                run_ops(store, [Complete(claim.key, self._clock_ms())])
            except StoreError as exc:
                self._return(tag, delivery.message_id, f"recording its key as done failed: {exc}")
                return
        handler_ms = monotonic_ms() - started
        self._perform(tag, self._planner.success(), delivery, received_ms, handler_ms)

    def _handler_call(self, value: Any, claim: Claim) -> Callable[[], None]:
        """The handler's call for ``value``: within the store's transaction for a
        transactional consumer, which marks ``claim``'s key done in the same commit."""
        if self._transactional:
            return functools.partial(
                call_in_transaction,
                cast(TransactionalStore, self._store),
                self._handler,
                value,
                key=claim.key,
                lease_until_ms=claim.lease_until_ms,
                now_ms=self._clock_ms(),
            )
        return functools.partial(self._handler, value)

    def _call_handler(self, value: Any, claim: Claim) -> None:
        assert self._connection is not None
        # The handler's thread logs with this delivery's fields (see delayq.logcontext).
        context = contextvars.copy_context()
        future = self._pool.submit(context.run, self._handler_call(value, claim))
        deadline = time.monotonic() + self._timeout_ms / 1000
        connected = True
        while not future.done():
            if time.monotonic() >= deadline:
                # The thread cannot be stopped: leave it and take a fresh one.
                self._pool.shutdown(wait=False)
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix="delayq-handler"
                )
                raise HandlerTimeout(
                    f"handler for {self.queue!r} ran longer than {self._timeout_ms / 1000:g} s"
                )
            if connected:
                try:
                    self._connection.sleep(0.01)  # keeps heartbeats flowing
                except LOST:
                    # The handler goes on; its key is still recorded when it ends, so
                    # the redelivery after the reconnect is a skipped duplicate.
                    connected = False
            else:
                concurrent.futures.wait([future], timeout=0.01)
        future.result()

    def _return(self, tag: int, message_id: str | None, why: str) -> None:
        """Put a delivery back on the queue: its fate could not be made safe now."""
        assert self._channel is not None
        log.error("returning %s to %s: %s", message_id, self.queue, why)
        self.stats.returned += 1
        if self._connection is not None:
            self._connection.sleep(self._return_pause_s)  # keeps heartbeats flowing
        self._channel.basic_nack(tag, requeue=True)

    def _perform(
        self,
        tag: int,
        decision: Decision,
        delivery: Delivery,
        received_ms: int,
        handler_ms: float | None = None,
    ) -> None:
        assert self._channel is not None
        if decision.message is not None:
            try:
                self._publisher.send(decision.message)
            except DelayqError as exc:
                # Not safely elsewhere: back to the queue (the broker's delivery
                # limit dead-letters it if this keeps happening).
                why = f"its republish was not confirmed: {exc}"
                self._return(tag, decision.message.message_id, why)
                return
        self._channel.basic_ack(tag)
        self.stats.record(decision)
        if self._observers:
            self._observers.emit(
                delivery,
                decision,
                received_at_ms=received_ms,
                settled_at_ms=self._clock_ms(),
                handler_ms=handler_ms,
            )
