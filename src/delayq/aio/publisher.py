"""The asyncio publisher (aio-pika): confirms pipelined, retried on a fresh connection."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from datetime import datetime, timezone
from types import TracebackType
from typing import Any

import aio_pika
import aiormq.exceptions as aex
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange

from delayq import outcomes
from delayq.aio._connection import (
    CONNECTION_ERRORS,
    close_quietly,
    connect,
    is_blocked,
    translate_channel_error,
)
from delayq.declarations import apply_marker
from delayq.envelope import (
    Message,
    MessageFactory,
    OutgoingMessage,
    Receipt,
    epoch_ms,
    new_message_id,
)
from delayq.errors import (
    AccessRefused,
    ConnectionFailed,
    DelayqError,
    PublishBatchError,
    PublishError,
    PublishUnconfirmed,
    TopologyMissing,
)
from delayq.marker import Gate
from delayq.published import PublishObserver, PublishObservers
from delayq.topology import Strategy, Topology
from delayq.urls import redact, resolve_url, resolved_memory_name

__all__ = ["AsyncPublisher"]

log = logging.getLogger("delayq.publisher")


def _pamqp_value(value: Any) -> Any:
    """pamqp encodes byte strings only as ``bytearray`` (pika only as ``bytes``)."""
    if isinstance(value, bytes):
        return bytearray(value)
    if isinstance(value, list):
        return [_pamqp_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _pamqp_value(v) for k, v in value.items()}
    return value


def aio_message(msg: OutgoingMessage) -> aio_pika.Message:
    headers = msg.headers
    if any(isinstance(v, (bytes, list, dict)) for v in headers.values()):
        headers = {k: _pamqp_value(v) for k, v in headers.items()}
    return aio_pika.Message(
        msg.body,
        headers=headers,
        content_type=msg.content_type,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        message_id=msg.message_id,
        timestamp=datetime.fromtimestamp(msg.timestamp_s, tz=timezone.utc),
    )


CHANNEL_REFUSED: tuple[type[BaseException], ...] = (*CONNECTION_ERRORS, RuntimeError)
"""Opening a channel on a connection the broker closed raises these (aiormq: RuntimeError)."""


class _BlockedBatch(Exception):
    """A batch's watchdog found the broker blocking publishers past the bound."""

class AsyncPublisher:
    """Publishes delayed messages through aio-pika; every publish is confirmed.

    >>> async with AsyncPublisher(url, topology) as pub:  # doctest: +SKIP
    ...     receipt = await pub.publish({"order": 42}, "orders.remind", "15m")

    Concurrent ``publish`` calls share one channel and pipeline their confirms;
    ``publish_many`` keeps up to ``window`` messages unconfirmed.

    Bodies and headers are checked against ``topology.limits`` before anything
    is sent (see :mod:`delayq.limits`); ``max_body_bytes`` overrides the body
    limit. ``url`` may be ``amqps://`` with TLS options (see :mod:`delayq.tls`).
    ``observers`` see each message's outcome (see :mod:`delayq.published`).
    """

    def __new__(cls, url: str | None = None, *args: Any, **kwargs: Any) -> AsyncPublisher:
        if cls is AsyncPublisher and resolved_memory_name(url) is not None:
            from delayq.testing.aio import AsyncMemoryPublisher

            return super().__new__(AsyncMemoryPublisher)
        return super().__new__(cls)

    def __init__(
        self,
        url: str | None = None,
        topology: Topology | None = None,
        *,
        max_body_bytes: int | None = None,
        publish_attempts: int = 3,
        connect_attempts: int = 3,
        retry_backoff_s: float = 0.2,
        confirm_timeout_s: float = 60.0,
        clock_ms: Callable[[], int] = epoch_ms,
        new_id: Callable[[], str] = new_message_id,
        observers: Iterable[PublishObserver] = (),
    ) -> None:
        self._url = resolve_url(url)
        self._observers = PublishObservers(observers)
        self.topology = topology if topology is not None else Topology()
        self._factory = MessageFactory(
            self.topology, max_body_bytes=max_body_bytes, clock_ms=clock_ms, new_id=new_id
        )
        self._publish_attempts = max(1, publish_attempts)
        self._connect_attempts = max(1, connect_attempts)
        self._backoff_s = retry_backoff_s
        self._confirm_timeout_s = confirm_timeout_s
        self._connection: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None
        self._exchanges: dict[str, AbstractExchange] = {}
        self._lock = asyncio.Lock()
        self._warned: AbstractConnection | None = None
        self._gate = Gate(
            self.topology.namespace, apply_marker(self.topology).name, redact(self._url)
        )

    def __repr__(self) -> str:
        return f"AsyncPublisher(url={redact(self._url)!r}, namespace={self.topology.namespace!r})"

    # Connection ---------------------------------------------------------------

    async def connect(self) -> None:
        """Open the connection now instead of at the first publish."""
        await self._ensure_channel()

    async def _ensure_channel(self) -> AbstractChannel:
        channel = self._channel
        if channel is not None and not channel.is_closed:
            return channel
        async with self._lock:  # one reconnect for many concurrent publishes
            if self._channel is not None and not self._channel.is_closed:
                return self._channel
            connection = self._connection
            if connection is not None and not connection.is_closed:
                try:
                    self._channel = await connection.channel(
                        publisher_confirms=True, on_return_raises=True
                    )
                    self._exchanges = {}
                    return self._channel
                except CHANNEL_REFUSED:  # the connection closed, not yet noticed here
                    await close_quietly(connection)
            connection = await connect(
                self._url, name="delayq-publisher", attempts=self._connect_attempts
            )
            try:
                await self._check_applied(connection)
            except BaseException:
                await close_quietly(connection)
                raise
            self._connection = connection
            self._channel = await self._connection.channel(
                publisher_confirms=True, on_return_raises=True
            )
            self._exchanges = {}
            return self._channel

    async def _check_applied(self, connection: AbstractConnection) -> None:
        """Refuse a namespace whose last apply did not complete (see :mod:`delayq.marker`);
        once per connection, on a channel of its own that a refusal may close."""
        probe = await connection.channel(publisher_confirms=False)
        try:
            await probe.get_exchange(self._gate.marker, ensure=True)
        except aex.ChannelNotFoundEntity as exc:
            raise self._gate.refusal() from exc
        except aex.AMQPChannelError as exc:
            raise translate_channel_error(exc) from exc
        finally:
            await close_quietly(probe)

    async def _exchange(self, name: str) -> AbstractExchange:
        channel = await self._ensure_channel()
        exchange = self._exchanges.get(name)
        if exchange is None:  # the cache is emptied whenever the channel is replaced
            exchange = await channel.get_exchange(name, ensure=False)
            self._exchanges[name] = exchange
        return exchange

    async def _drop_connection(self, connection: AbstractConnection | None) -> None:
        # Only drop the connection that failed: a concurrent publish may have
        # opened a fresh one already.
        if connection is not None and connection is self._connection:
            self._connection = None
            self._channel = None
            await close_quietly(connection)

    async def aclose(self) -> None:
        """Close the connection; later publishes reconnect."""
        connection, self._connection, self._channel = self._connection, None, None
        await close_quietly(connection)

    async def __aenter__(self) -> AsyncPublisher:
        return self  # connects at the first publish, as Publisher does, or on connect()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _check_exchanges(self, names: set[str]) -> None:
        # A publish to a missing exchange closes the shared channel and fails every
        # message in flight on it, so a batch checks its few exchanges first.
        probe: AbstractChannel | None = None
        try:
            await self._ensure_channel()
            assert self._connection is not None
            probe = await self._connection.channel(publisher_confirms=False)
            for name in sorted(names):
                await probe.get_exchange(name, ensure=True)
        except aex.AMQPChannelError as exc:
            raise translate_channel_error(exc) from exc
        except DelayqError:
            raise
        except Exception as exc:  # CONNECTION_ERRORS, or aiormq's bare Exception on a close
            raise ConnectionFailed(
                f"lost the connection to {redact(self._url)} before the batch was sent "
                f"({type(exc).__name__}); nothing of it was sent"
            ) from exc
        finally:
            await close_quietly(probe)

    # Publishing ---------------------------------------------------------------

    async def publish(
        self,
        body: object,
        routing_key: str,
        delay: object,
        *,
        message_id: str | None = None,
        headers: Mapping[str, Any] | None = None,
        strategy: Strategy | str | None = None,
    ) -> Receipt:
        """Publish one message and wait for the broker's confirm.

        Same arguments, receipt and errors as :meth:`delayq.sync.Publisher.publish`.
        """
        msg = self._factory.build(
            body, routing_key, delay, message_id=message_id, headers=headers, strategy=strategy
        )
        await self.send(msg)
        return msg.receipt

    async def send(self, msg: OutgoingMessage) -> None:
        """Send an already built message with confirm and bounded retries."""
        with self._observers.reporting([msg]):
            await self._send(msg, self._confirm_timeout_s)

    async def _send(self, msg: OutgoingMessage, timeout_s: float | None) -> None:
        message = aio_message(msg)
        last: BaseException | None = None
        handed_over = False  # once written to a socket, its fate is unknown until confirmed
        for attempt in range(self._publish_attempts):
            if attempt:
                await asyncio.sleep(self._backoff_s * 2 ** (attempt - 1))
            connection = self._connection
            try:
                channel = self._channel
                exchange = None
                if channel is not None and not channel.is_closed:
                    exchange = self._exchanges.get(msg.exchange)  # the hot path: no await
                if exchange is None:
                    exchange = await self._exchange(msg.exchange)
                connection = self._connection
                handed_over = True
                await exchange.publish(message, msg.routing_key, mandatory=True, timeout=timeout_s)
                return
            except aex.PublishError as exc:  # a Basic.Return, with on_return_raises
                raise outcomes.unroutable(msg) from exc
            except aex.DeliveryError as exc:  # a Basic.Nack
                raise outcomes.rejected(msg) from exc
            except aex.AMQPChannelError as exc:
                error = translate_channel_error(exc)
                if isinstance(error, (TopologyMissing, AccessRefused)):
                    raise error from exc
                raise outcomes.rejected(msg, str(error)) from exc
            except ConnectionFailed as exc:
                if not handed_over:
                    raise  # never sent: the connect retries are spent, say so plainly
                last = exc
                break
            except DelayqError:
                raise
            except Exception as exc:
                # CONNECTION_ERRORS, and what aiormq fails a publish with when its
                # connection closes under it: a bare Exception (the default of its
                # futures' reject_all), RuntimeError. Either way the connection's
                # state is unknown: a fresh one may succeed.
                if isinstance(exc, asyncio.TimeoutError) and is_blocked(connection):
                    # Retrying cannot help while the broker blocks publishers.
                    await self._drop_connection(connection)
                    raise outcomes.blocked(msg, timeout_s or 0, redact(self._url)) from exc
                last = exc
                self._warn_lost(connection, exc, attempt)
                await self._drop_connection(connection)
        raise outcomes.unconfirmed(msg, attempt + 1, redact(self._url), last) from last

    def _warn_lost(
        self, connection: AbstractConnection | None, exc: BaseException, attempt: int
    ) -> None:
        # Once per lost connection, not once per message: a batch of thousands in
        # flight fails all at once.
        if connection is not None and connection is self._warned:
            return
        self._warned = connection
        log.warning(
            "a publish failed (%s), attempt %d of %d%s",
            type(exc).__name__,
            attempt + 1,
            self._publish_attempts,
            "; re-sending on a fresh connection" if attempt + 1 < self._publish_attempts else "",
        )

    @staticmethod
    async def _run_senders(
        sender: Callable[[], Coroutine[Any, Any, None]],
        watchdog: Callable[[], Coroutine[Any, Any, None]],
        count: int,
    ) -> None:
        """Run ``count`` senders to the end; the first error (``AccessRefused`` first)
        cancels the others, which would only fail the same way or race a closing channel."""
        # Until every sender is done, a sender fails, or the watchdog gives up (it never
        # ends by itself). Counted in done-callbacks: asyncio.wait over `count` tasks,
        # woken once per finished sender, would cost count**2 at the end of each batch
        # (a window of 1,000 made a 2,000-message batch take twice the CPU).
        over = asyncio.Event()
        remaining = count

        def sender_done(task: asyncio.Task[None]) -> None:
            nonlocal remaining
            remaining -= 1
            if remaining == 0 or (not task.cancelled() and task.exception() is not None):
                over.set()

        guard = asyncio.create_task(watchdog())
        guard.add_done_callback(lambda _task: over.set())
        senders = [asyncio.create_task(sender()) for _ in range(count)]
        for task in senders:
            task.add_done_callback(sender_done)
        try:
            await over.wait()
            if guard.done():
                guard.result()  # raises what the watchdog raised
        finally:
            guard.cancel()
            for task in senders:
                task.cancel()
            await asyncio.gather(guard, *senders, return_exceptions=True)
        errors = [
            e for t in senders if t.done() and not t.cancelled() and (e := t.exception())
        ]
        if errors:
            raise next((e for e in errors if isinstance(e, AccessRefused)), errors[0])

    async def publish_many(
        self, messages: Iterable[Message], *, window: int = 1000
    ) -> list[Receipt]:
        """Publish a batch with up to ``window`` confirms outstanding.

        Every message is validated before any is sent. Returns receipts in input
        order, or raises :class:`~delayq.errors.PublishBatchError` naming each
        message that was not confirmed (the others were).
        """
        built = self._factory.build_many(messages)
        if not built:
            return []
        with self._observers.reporting(built):
            await self._publish_built(built, window)
        return [m.receipt for m in built]

    async def _publish_built(self, built: list[OutgoingMessage], window: int) -> None:
        await self._check_exchanges({m.exchange for m in built})
        failures: dict[int, PublishError] = {}
        in_flight: set[int] = set()
        unreachable: ConnectionFailed | None = None
        queue = iter(enumerate(built))
        last_progress = time.monotonic()

        async def sender() -> None:
            # `window` senders share one iterator: at most `window` confirms are
            # outstanding, with no task or semaphore per message.
            nonlocal last_progress, unreachable
            for index, msg in queue:
                if unreachable is not None:
                    # No connection could be opened: the rest of the batch fails at
                    # once instead of each message trying (and failing) to connect.
                    failures[index] = outcomes.unconfirmed(
                        msg, self._publish_attempts, redact(self._url), unreachable
                    )
                    continue
                in_flight.add(index)
                try:
                    # No per-message confirm timer (one each costs more than the
                    # publish): the watchdog below guards the batch as a whole.
                    await self._send(msg, None)
                except TopologyMissing as exc:  # deleted during the batch
                    failures[index] = PublishUnconfirmed(str(exc), msg.message_id)
                except PublishError as exc:
                    failures[index] = exc
                    if isinstance(exc.__cause__, ConnectionFailed):
                        unreachable = exc.__cause__
                except ConnectionFailed as exc:
                    # The connection was lost and no new one could be opened: this
                    # message is unconfirmed, and those confirmed before it still are.
                    failures[index] = outcomes.unconfirmed(
                        msg, self._publish_attempts, redact(self._url), exc
                    )
                    unreachable = exc
                in_flight.discard(index)
                last_progress = time.monotonic()

        async def watchdog() -> None:
            nonlocal last_progress
            while True:
                await asyncio.sleep(1.0)
                if time.monotonic() - last_progress > self._confirm_timeout_s:
                    if is_blocked(self._connection):
                        # Re-sending cannot help while the broker blocks publishers
                        # (a fresh connection is blocked at its first publish too):
                        # what is still unconfirmed fails with PublishBlocked.
                        raise _BlockedBatch
                    log.warning(
                        "no confirm for %.0f s; reconnecting to re-send the batch's "
                        "unconfirmed messages",
                        self._confirm_timeout_s,
                    )
                    last_progress = time.monotonic()
                    await self._drop_connection(self._connection)

        try:
            await self._run_senders(sender, watchdog, min(max(1, window), len(built)))
        except _BlockedBatch:
            url = redact(self._url)
            for index, msg in [*((i, built[i]) for i in in_flight), *queue]:
                failures[index] = outcomes.blocked(msg, self._confirm_timeout_s, url)
            await self._drop_connection(self._connection)
        if failures:
            receipts = [None if i in failures else m.receipt for i, m in enumerate(built)]
            raise PublishBatchError(receipts, failures)
