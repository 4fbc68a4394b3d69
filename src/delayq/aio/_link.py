"""The aio-pika link: :class:`~delayq.aio.AsyncPublisher`'s AMQP I/O through aio-pika.

The default link is the frame link (:mod:`delayq.aio._framelink`, several times
faster); this one stays as a ``link=`` for a publisher that wants aio-pika's
connection, and as the reference the frame link's frames are tested against
(:func:`aio_message`).

One connection and one confirming channel shared by concurrent sends, re-opened
after a loss; a batch keeps up to ``window`` confirms outstanding on it, guarded
by a watchdog. A send is retried on a fresh connection up to
``publish_attempts`` times once its fate is unknown; the namespace's apply
marker is checked once per connection (see :mod:`delayq.topology.marker`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from datetime import datetime, timezone
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange

from delayq.aio._connection import close_quietly, connect, is_blocked
from delayq.aio._errors import (
    CHANNEL_CLOSED,
    CONNECTION_ERRORS,
    NOT_TAKEN,
    channel_error,
    is_missing,
    publish_refusal,
)
from delayq.aio.provision import apply_topology_async
from delayq.errors import (
    AccessRefused,
    ConnectionFailed,
    DelayqError,
    InvalidInput,
    PublishBatchError,
    PublishError,
    PublishUnconfirmed,
    TopologyMissing,
)
from delayq.links import LinkOptions
from delayq.message import outcomes
from delayq.message.envelope import OutgoingMessage
from delayq.message.frames import CARRIED, pamqp_value
from delayq.topology.marker import Gate
from delayq.topology.model import Topology
from delayq.topology.report import ApplyReport
from delayq.urls import redact

__all__ = ["AioPikaLink", "aio_message"]

log = logging.getLogger("delayq.publisher")


_pamqp_value = pamqp_value


def aio_message(msg: OutgoingMessage) -> aio_pika.Message:
    headers = msg.headers
    if any(isinstance(v, (bytes, list, dict)) for v in headers.values()):
        headers = {k: _pamqp_value(v) for k, v in headers.items()}
    carried: dict[str, Any] = {}
    if msg.properties:
        unknown = msg.properties.keys() - CARRIED
        if unknown:
            raise InvalidInput(f"AMQP properties {sorted(unknown)!r} cannot be carried")
        carried = dict(msg.properties)
        if isinstance(carried.get("timestamp"), int):
            carried["timestamp"] = datetime.fromtimestamp(carried["timestamp"], tz=timezone.utc)
    fields: dict[str, Any] = {
        "content_type": msg.content_type,
        "delivery_mode": aio_pika.DeliveryMode.PERSISTENT,
        "message_id": msg.message_id,
        "timestamp": datetime.fromtimestamp(msg.timestamp_s, tz=timezone.utc),
        **carried,
    }
    return aio_pika.Message(msg.body, headers=headers, **fields)


CHANNEL_REFUSED: tuple[type[BaseException], ...] = (*CONNECTION_ERRORS, RuntimeError)
"""Opening a channel on a connection the broker closed raises these (aiormq: RuntimeError)."""


class _BlockedBatch(Exception):
    """A batch's watchdog found the broker blocking publishers past the bound."""


class AioPikaLink:
    """An :class:`~delayq.links.AsyncLink` to RabbitMQ through aio-pika."""

    clock_ms: Callable[[], int] | None = None

    def __init__(self, url: str, gate: Gate, options: LinkOptions) -> None:
        self._url = url
        self._gate = gate
        self._publish_attempts = max(1, options.publish_attempts)
        self._connect_attempts = max(1, options.connect_attempts)
        self._backoff_s = options.retry_backoff_s
        self._confirm_timeout_s = options.confirm_timeout_s
        self._connection: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None
        self._exchanges: dict[str, AbstractExchange] = {}
        self._lock = asyncio.Lock()
        self._closing: set[asyncio.Task[None]] = set()
        self._warned: AbstractConnection | None = None

    def __repr__(self) -> str:
        return f"AioPikaLink({redact(self._url)!r})"

    async def connect(self) -> None:
        await self._ensure_channel()

    async def send(self, msg: OutgoingMessage) -> None:
        await self._send(msg, self._confirm_timeout_s)

    async def send_batch(self, built: list[OutgoingMessage], window: int) -> None:
        await self._publish_built(built, window)

    async def close(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        await close_quietly(connection)
        for closing in list(self._closing):  # a blocked connection's close: not waited for
            closing.cancel()
        await asyncio.gather(*self._closing, return_exceptions=True)

    async def apply(self, topology: Topology, *, raise_on_conflict: bool = True) -> ApplyReport:
        return await apply_topology_async(topology, self._url, raise_on_conflict=raise_on_conflict)

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
        """Refuse a namespace whose last apply did not complete (see :mod:`delayq.topology.marker`);
        once per connection, on a channel of its own that a refusal may close."""
        probe = await connection.channel(publisher_confirms=False)
        try:
            await probe.get_exchange(self._gate.marker, ensure=True)
        except CHANNEL_CLOSED as exc:
            if is_missing(exc):
                raise self._gate.refusal() from exc
            raise channel_error(exc) from exc
        finally:
            await close_quietly(probe)

    async def _exchange(self, name: str) -> AbstractExchange:
        channel = await self._ensure_channel()
        exchange = self._exchanges.get(name)
        if exchange is None:  # the cache is emptied whenever the channel is replaced
            exchange = await channel.get_exchange(name, ensure=False)
            self._exchanges[name] = exchange
        return exchange

    async def _drop_connection(
        self, connection: AbstractConnection | None, *, wait: bool = True
    ) -> None:
        # Only drop the connection that failed: a concurrent publish may have
        # opened a fresh one already.
        if connection is not None and connection is self._connection:
            self._connection = None
            self._channel = None
            if wait:
                await close_quietly(connection)
                return
            # A blocked broker reads nothing more from the socket, so the close
            # handshake waits too: the caller is told now, the close ends on its own.
            closing = asyncio.ensure_future(close_quietly(connection))
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)

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
        except CHANNEL_CLOSED as exc:
            raise channel_error(exc) from exc
        except DelayqError:
            raise
        except Exception as exc:  # CONNECTION_ERRORS, or aiormq's bare Exception on a close
            raise ConnectionFailed(
                f"lost the connection to {redact(self._url)} before the batch was sent "
                f"({type(exc).__name__}); nothing of it was sent"
            ) from exc
        finally:
            await close_quietly(probe)

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
            except (CHANNEL_CLOSED, *NOT_TAKEN) as exc:
                refusal = publish_refusal(exc, msg)
                assert refusal is not None
                raise refusal from exc
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
                    await self._drop_connection(connection, wait=False)
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
        errors = [e for t in senders if t.done() and not t.cancelled() and (e := t.exception())]
        if errors:
            raise next((e for e in errors if isinstance(e, AccessRefused)), errors[0])

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
                # Wakes at the exact deadline (the last progress plus the bound), not on a
                # polling tick: a 3 s bound was honoured at 5 s with a 1 s poll.
                wait_s = last_progress + self._confirm_timeout_s - time.monotonic()
                if wait_s > 0:
                    await asyncio.sleep(wait_s)
                    continue
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
            await self._drop_connection(self._connection, wait=False)
        if failures:
            receipts = [None if i in failures else m.receipt for i, m in enumerate(built)]
            raise PublishBatchError(receipts, failures)
