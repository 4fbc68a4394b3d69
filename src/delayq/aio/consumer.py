"""The asyncio consumer (aio-pika): performs what :class:`~delayq.delivery.DeliveryPlanner` decides.

Each delivery ends in exactly one of: done, duplicate skipped, retried later
(republished to a retry tier addressed to this queue alone, confirmed, then
acked) or dead-lettered (republished to ``<queue>.dlq`` with the reason,
confirmed, then acked). If the republish cannot be confirmed the delivery is
returned to the queue instead: nothing is acked that is not safely elsewhere.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import aiormq.exceptions as aex
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage
from pydantic import BaseModel

from delayq.aio._connection import CONNECTION_ERRORS, close_quietly, connect
from delayq.aio.provision import apply_topology
from delayq.aio.publisher import AsyncPublisher
from delayq.delivery import (
    ConsumeSettings,
    Decision,
    Delivery,
    DeliveryPlanner,
    Undecodable,
    decode_body,
    idempotency_key,
)
from delayq.envelope import epoch_ms
from delayq.errors import DelayqError, HandlerTimeout, PublishError
from delayq.idempotency import ClaimStatus, IdempotencyStore
from delayq.retry import RetryPolicy
from delayq.stats import ConsumerStats
from delayq.topology import Topology
from delayq.urls import redact, resolve_url

__all__ = ["AsyncConsumer"]

log = logging.getLogger("delayq.consumer")

MAX_RECONNECT_PAUSE_S = 10.0
"""The longest pause between two reconnect attempts after the connection was lost."""

_RECONNECT_ERRORS: tuple[type[BaseException], ...] = (
    DelayqError,
    aex.AMQPError,
    *CONNECTION_ERRORS,
)

Handler = Callable[[Any], Awaitable[Any]] | Callable[[Any], Any]


class AsyncConsumer:
    """Runs ``handler`` for every message of ``queue``, with retries, a DLQ and dedup.

    >>> consumer = AsyncConsumer(url, topology, "orders.reminders", send_reminder,  # doctest: +SKIP
    ...                          policy=ExponentialBackoff(initial="30s", max_attempts=5),
    ...                          store=SQLiteStore("keys.db"), key=lambda order: order["id"])
    >>> await consumer.run()   # until SIGTERM/SIGINT, then a graceful stop  # doctest: +SKIP

    ``handler`` takes the decoded body (a ``model`` instance when ``model`` is
    given) and may be a coroutine function or a plain one (run in a thread; a
    plain function cannot be interrupted when it overruns ``handler_timeout``).
    """

    def __init__(
        self,
        url: str | None,
        topology: Topology,
        queue: str,
        handler: Handler,
        *,
        policy: RetryPolicy | None = None,
        store: IdempotencyStore | None = None,
        key: Callable[[Any], str] | None = None,
        model: type[BaseModel] | None = None,
        prefetch: int = 50,
        concurrency: int | None = None,
        handler_timeout: object = "5m",
        lease: object = None,
        retention: object = "7d",
        non_retryable: tuple[type[BaseException], ...] = (),
        clock_ms: Callable[[], int] = epoch_ms,
        rng: random.Random | None = None,
    ) -> None:
        settings = ConsumeSettings.parse(
            prefetch=prefetch, handler_timeout=handler_timeout, lease=lease, retention=retention
        )
        self._url = resolve_url(url)
        self.topology = topology
        self.queue = queue
        self._handler = handler
        self._is_async = inspect.iscoroutinefunction(handler)
        self._planner = DeliveryPlanner(
            topology,
            queue,
            policy=policy,
            non_retryable=non_retryable,
            clock_ms=clock_ms,
            rng=rng,
        )
        self._store = store
        self._key = key
        self._model = model
        self._prefetch = prefetch
        self._slots = asyncio.Semaphore(concurrency or prefetch)
        self._timeout_ms = settings.handler_timeout_ms
        self._lease_ms = settings.lease_ms
        self._settings = settings
        self._pruner: asyncio.Task[None] | None = None
        self._clock_ms = clock_ms
        self._publisher = AsyncPublisher(self._url, topology, clock_ms=clock_ms)
        self._connection: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None
        self._consumer_tag: str | None = None
        self._in_flight: set[asyncio.Task[None]] = set()
        self._releasing: set[asyncio.Future[Any]] = set()  # claims given back after a cancel
        self._stopped = asyncio.Event()
        self._stopping = False
        self._reconnector: asyncio.Task[None] | None = None
        self.reconnects = 0
        """How many times the connection was lost and a reconnect began."""
        self.stats = ConsumerStats()

    def __repr__(self) -> str:
        return f"AsyncConsumer(url={redact(self._url)!r}, queue={self.queue!r})"

    # Life cycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Declare the topology, then start taking deliveries."""
        self._stopping = False
        self._connection = await connect(self._url, name=f"delayq-consumer {self.queue}")
        await apply_topology(self.topology, connection=self._connection)
        await self._publisher.connect()
        await self._consume(self._connection)
        self._stopped.clear()
        if self._store is not None:
            self._pruner = asyncio.create_task(self._prune_forever())
        log.info("consuming %s (prefetch %d)", self.queue, self._prefetch)

    async def _consume(self, connection: AbstractConnection) -> None:
        """Take deliveries on ``connection``; when it is lost, reconnect (any host of the URL)."""
        self._connection = connection
        self._channel = await connection.channel(publisher_confirms=False)
        await self._channel.set_qos(prefetch_count=self._prefetch)
        queue = await self._channel.get_queue(self.queue, ensure=False)
        self._consumer_tag = await queue.consume(self._on_message, no_ack=False)
        connection.close_callbacks.add(self._on_connection_closed)

    def _on_connection_closed(self, connection: object, exc: BaseException | None) -> None:
        if self._stopping or connection is not self._connection:
            return
        log.warning("lost the connection of %s (%r); reconnecting", self.queue, exc)
        self.reconnects += 1
        self._reconnector = asyncio.create_task(self._reconnect())

    async def _reconnect(self) -> None:
        # Unacked deliveries went back to the queue with the connection; the
        # idempotency store absorbs those whose effect already happened.
        pause_s = 0.5
        while not self._stopping:
            connection: AbstractConnection | None = None
            try:
                connection = await connect(self._url, name=f"delayq-consumer {self.queue}")
                await self._consume(connection)
                log.info("consuming %s again", self.queue)
                return
            except _RECONNECT_ERRORS as exc:
                log.warning("reconnecting %s failed (%r); again in %g s", self.queue, exc, pause_s)
                self._connection = None
                await close_quietly(connection)
            await asyncio.sleep(pause_s)
            pause_s = min(pause_s * 2, MAX_RECONNECT_PAUSE_S)

    async def _prune_forever(self) -> None:
        """Forget keys past the retention period, every tenth of it (at most 10 min)."""
        assert self._store is not None
        while True:
            try:
                older_than = self._clock_ms() - self._settings.retention_ms
                await self._store_call(self._store.prune, older_than_ms=older_than)
            except Exception as exc:
                log.warning("pruning the idempotency store failed: %r", exc)
            await asyncio.sleep(self._settings.prune_every_ms / 1000)

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Stop taking deliveries, let in-flight ones finish (up to ``timeout_s``), close.

        In-flight handlers still running at the deadline are cancelled and their
        deliveries go back to the queue unacked, to be delivered again.
        """
        self._stopping = True
        if self._reconnector is not None:
            self._reconnector.cancel()
            self._reconnector = None
        if self._pruner is not None:
            self._pruner.cancel()
            self._pruner = None
        if self._channel is not None and self._consumer_tag is not None:
            try:
                queue = await self._channel.get_queue(self.queue, ensure=False)
                await queue.cancel(self._consumer_tag)
            except Exception as exc:
                log.debug("cancel failed: %r", exc)
            self._consumer_tag = None
        if self._in_flight:
            _, pending = await asyncio.wait(self._in_flight, timeout=timeout_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=5)
        await close_quietly(self._channel)
        await close_quietly(self._connection)
        await self._publisher.aclose()
        self._stopped.set()

    async def run(self, *, install_signal_handlers: bool = True) -> None:
        """Consume until SIGTERM or SIGINT (or :meth:`request_stop`), then stop gracefully."""
        await self.start()
        loop = asyncio.get_running_loop()
        stop_requested = asyncio.Event()
        self._stop_requested = stop_requested
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

    def request_stop(self) -> None:
        """Ask :meth:`run` to stop gracefully."""
        event = getattr(self, "_stop_requested", None)
        if event is not None:
            event.set()

    # Deliveries ---------------------------------------------------------------

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._in_flight.add(task)
        try:
            async with self._slots:
                await self._process(message)
        finally:
            if task is not None:
                self._in_flight.discard(task)

    async def _store_call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        assert self._store is not None
        if self._store.blocking:
            return await asyncio.to_thread(fn, *args, **kwargs)
        return fn(*args, **kwargs)

    async def _process(self, message: AbstractIncomingMessage) -> None:
        delivery = Delivery(
            queue=self.queue,
            body=message.body,
            routing_key=message.routing_key or "",
            message_id=message.message_id,
            content_type=message.content_type,
            headers=dict(message.headers or {}),
            redelivered=bool(message.redelivered),
        )
        try:
            value = decode_body(delivery, self._model)
        except Undecodable as exc:
            await self._perform(message, self._planner.undecodable(delivery, exc))
            return
        key = idempotency_key(value, delivery, self._key)
        if key is not None and self._store is not None:
            status = await self._claim(self._store, key)
            if status is ClaimStatus.DONE:
                await self._perform(message, self._planner.duplicate())
                return
            if status is ClaimStatus.BUSY:
                await self._perform(message, self._planner.deferred(delivery))
                return
        try:
            await self._call_handler(value)
        except asyncio.CancelledError:
            if key is not None and self._store is not None:
                await self._store_call(self._store.release, key)
            raise  # shutting down: the delivery goes back to the queue unacked
        except Exception as exc:
            if key is not None and self._store is not None:
                await self._store_call(self._store.release, key)
            await self._perform(message, self._planner.failure(delivery, exc))
            return
        if key is not None and self._store is not None:
            await self._store_call(self._store.complete, key, now_ms=self._clock_ms())
        await self._perform(message, self._planner.success())

    async def _claim(self, store: IdempotencyStore, key: str) -> ClaimStatus:
        """Claim ``key``. If this delivery is cancelled meanwhile (aiormq cancels every
        delivery in flight when the connection is lost), the claim still lands in the
        store's thread: give it back then, or the key stays busy until its lease ends
        and every redelivery of it is deferred until then."""
        claiming = asyncio.ensure_future(
            self._store_call(store.claim, key, lease_ms=self._lease_ms, now_ms=self._clock_ms())
        )
        try:
            status: ClaimStatus = await asyncio.shield(claiming)
        except asyncio.CancelledError:

            def give_back(done: asyncio.Future[Any]) -> None:
                if not done.cancelled() and done.exception() is None:
                    if done.result() is ClaimStatus.CLAIMED:
                        releasing = asyncio.ensure_future(self._store_call(store.release, key))
                        self._releasing.add(releasing)
                        releasing.add_done_callback(self._releasing.discard)

            claiming.add_done_callback(give_back)
            raise
        return status

    async def _call_handler(self, value: Any) -> None:
        timeout_s = self._timeout_ms / 1000
        try:
            if self._is_async:
                await asyncio.wait_for(self._handler(value), timeout_s)
            else:
                await asyncio.wait_for(asyncio.to_thread(self._handler, value), timeout_s)
        except asyncio.TimeoutError:
            raise HandlerTimeout(
                f"handler for {self.queue!r} ran longer than {timeout_s:g} s"
            ) from None

    async def _perform(self, message: AbstractIncomingMessage, decision: Decision) -> None:
        if decision.message is not None:
            try:
                await self._publisher.send(decision.message)
            except (PublishError, DelayqError) as exc:
                # Not safely elsewhere: back to the queue (the broker's delivery
                # limit dead-letters it if this keeps happening).
                log.error(
                    "could not republish %s (%s); returning it to %s",
                    decision.message.message_id,
                    exc,
                    self.queue,
                )
                self.stats.returned += 1
                await asyncio.sleep(1.0)
                await message.nack(requeue=True)
                return
        await message.ack()
        self.stats.record(decision)
