"""The asyncio publisher: every publish confirmed, confirms pipelined.

The publisher builds and checks messages and reports their outcomes; its link
(:mod:`delayq.links`; for AMQP URLs the frame link, :mod:`delayq.aio._framelink`, which
writes AMQP frames itself) does the I/O.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any

from delayq.aio._admission import Admission
from delayq.contexts import NoSyncContext
from delayq.durations import Duration
from delayq.errors import DelayqError, PublishBatchError, PublishError
from delayq.forking import abandon, forget_in_children
from delayq.links import AsyncLink, LinkOptions, gate_for, open_async_link
from delayq.message import outcomes
from delayq.message.cancel import (
    CancelReceipt,
    Generations,
    RescheduleReceipt,
    one_of,
    plan_cancels,
    plan_reschedule,
    store_for_cancels,
)
from delayq.message.envelope import Message, OutgoingMessage, Receipt, epoch_ms, new_message_id
from delayq.message.factory import MessageFactory
from delayq.message.inflight import (
    InFlightLimit,
    batch_window,
    check_window,
    limit_or_default,
    size_of,
)
from delayq.message.reschedule import Reschedule, plan_reschedules
from delayq.observe.publishes import PublishObserver, PublishObservers
from delayq.observe.tracing import TracingOption, traced, tracing_for
from delayq.retrying import within_seconds
from delayq.schedule.batch import arecord_batch
from delayq.schedule.record import ScheduleIndex, arecording
from delayq.stores.base import (
    Cancel,
    CancellingStore,
    CancelStatus,
    IdempotencyStore,
    run_cancels,
)
from delayq.stores.key_scope import KeyScope
from delayq.topology.model import Strategy, Topology
from delayq.urls import redact, resolve_url

__all__ = ["AsyncPublisher"]

log = logging.getLogger("delayq.publisher")


class AsyncPublisher(NoSyncContext):
    """Publishes delayed messages on asyncio; every publish is confirmed.

    >>> async with AsyncPublisher(url, topology) as pub:  # doctest: +SKIP
    ...     receipt = await pub.publish({"order": 42}, "orders.remind", "15m")

    Concurrent ``publish`` calls share one channel and pipeline their confirms;
    ``publish_many`` keeps up to ``window`` messages unconfirmed.

    Bodies and headers are checked against ``topology.limits`` before anything
    is sent (see :mod:`delayq.message.limits`); ``max_body_bytes`` overrides the body
    limit. ``url`` may be ``amqps://`` with TLS options (see :mod:`delayq.tls`).
    ``observers`` see each message's outcome (see :mod:`delayq.observe.publishes`).
    ``link`` replaces the broker I/O (see :mod:`delayq.links`); by default the
    URL's scheme chooses it (``amqp``, ``amqps``, ``memory``).

    ``blocked_timeout_s``: how long the broker may block publishers (a memory or disk
    alarm) before the publishes waiting on it fail with
    :class:`~delayq.errors.PublishBlocked` (30 s, as ``Publisher``'s).

    ``reconnect_within``: how long a lost broker is waited for once connected (30 s;
    ``None``: ``connect_attempts`` rounds, as for a first connection); the rules and
    what a batch then reports are in :mod:`delayq.retrying`.

    ``in_flight`` bounds what all of this publisher's concurrent publishes hold sent
    but unconfirmed (10,000 messages or 64 MiB by default): a publish that would
    pass it waits for confirms, up to ``in_flight.wait``, then raises
    :class:`~delayq.errors.PublishBackpressure` with nothing sent (or raises at
    once with ``when_full="raise"``); see :mod:`delayq.message.inflight`.

    ``tracing``: OpenTelemetry ``publish`` spans and trace context in the headers
    (see :mod:`delayq.observe.tracing`; by default on when a tracer provider is set).
    """

    def __init__(
        self,
        url: str | None = None,
        topology: Topology | None = None,
        *,
        max_body_bytes: int | None = None,
        publish_attempts: int = 3,
        connect_attempts: int = 3,
        reconnect_within: Duration | None = "30s",
        retry_backoff_s: float = 0.2,
        confirm_timeout_s: float = 60.0,
        blocked_timeout_s: float = 30.0,
        clock_ms: Callable[[], int] = epoch_ms,
        new_id: Callable[[], str] = new_message_id,
        observers: Iterable[PublishObserver] = (),
        link: AsyncLink | None = None,
        in_flight: InFlightLimit | None = None,
        store: IdempotencyStore | None = None,
        tracing: TracingOption = None,
        schedule: ScheduleIndex | None = None,
    ) -> None:
        self._url = resolve_url(url)
        self.schedule = schedule
        """Where each delayed message is recorded (:mod:`delayq.schedule`), or ``None``."""
        self._tracing = tracing_for(tracing)
        self.store = store
        """The consumers' idempotency store, for :meth:`cancel` (``None``: cannot cancel)."""
        self._admission = Admission(limit_or_default(in_flight))
        self._observers = PublishObservers(observers)
        self.topology = topology if topology is not None else Topology()
        self._gate = gate_for(self.topology, self._url)
        self._options: LinkOptions | None = None
        if link is None:
            options = self._options = LinkOptions(
                publish_attempts=publish_attempts,
                connect_attempts=connect_attempts,
                reconnect_within_s=within_seconds(reconnect_within),
                frame_max=self.topology.limits.frame_max,
                retry_backoff_s=retry_backoff_s,
                confirm_timeout_s=confirm_timeout_s,
                blocked_timeout_s=blocked_timeout_s,
            )
            link = open_async_link(self._url, self._gate, options)
        self._link = link
        if self._options is not None:
            forget_in_children(self)
        if clock_ms is epoch_ms and link.clock_ms is not None:
            clock_ms = link.clock_ms  # the broker's own clock: a memory broker's virtual time
        self._clock_ms = clock_ms
        self._generations = Generations()
        self._factory = MessageFactory(
            self.topology, max_body_bytes=max_body_bytes, clock_ms=clock_ms, new_id=new_id
        )

    def __repr__(self) -> str:
        return f"AsyncPublisher(url={redact(self._url)!r}, namespace={self.topology.namespace!r})"

    # Connection ---------------------------------------------------------------

    def _forget_inherited(self) -> None:
        """In a forked child (:mod:`delayq.forking`): a connection of its own next time,
        on the child's event loop, with no room held by the parent's publishes."""
        assert self._options is not None
        abandon(self._link)
        self._link = open_async_link(self._url, self._gate, self._options)
        self._admission = Admission(self._admission.limit)

    async def connect(self) -> None:
        """Open the connection now instead of at the first publish."""
        await self._link.connect()

    @property
    def link(self) -> AsyncLink:
        """What this publisher sends through (see :mod:`delayq.links`)."""
        return self._link

    @property
    def factory(self) -> MessageFactory:
        """The pure builder this publisher validates and builds messages with."""
        return self._factory

    async def aclose(self) -> None:
        """Close the connection; later publishes reconnect."""
        await self._link.close()

    async def __aenter__(self) -> AsyncPublisher:
        return self  # connects at the first publish, as Publisher does, or on connect()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

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
        return (await self._send(msg, keep=False)).receipt

    async def send(self, msg: OutgoingMessage) -> None:
        """Send an already built message with confirm and bounded retries (one that
        carries a ``traceparent`` keeps it: a retry, a replay stays in its trace)."""
        await self._send(msg, keep=True)

    async def _send(self, msg: OutgoingMessage, *, keep: bool) -> OutgoingMessage:
        """Send ``msg``; returns it as sent (restamped if it waited for room)."""
        with self._observers.reporting([msg]), traced(self._tracing, [msg], keep=keep):
            # take/give rather than ``async with hold``: a publish per coroutine of a web
            # application pays this per message (an async context manager is a generator).
            admission, size = self._admission, size_of(msg)
            waited = not admission.take_now(1, size) and await admission.take(1, size)
            try:
                if waited:
                    (msg,) = self._factory.restamp([msg])
                if self.schedule is None:
                    await self._link.send(msg)
                else:
                    async with arecording(self.schedule, self.topology, [msg], self._clock_ms):
                        await self._link.send(msg)
            except DelayqError:
                raise
            except Exception as exc:
                raise self._unexpected(exc, msg) from exc
            finally:
                admission.give(1, size)
        return msg

    @property
    def in_flight(self) -> InFlightLimit:
        """The bound on what this publisher holds unconfirmed (:mod:`delayq.message.inflight`)."""
        return self._admission.limit

    def _unexpected(self, exc: Exception, msg: OutgoingMessage) -> PublishError:
        """A link let a non-delayq error out: the message's fate is unknown, said as such."""
        log.error("the link failed a publish with %r; reported as unconfirmed", exc, exc_info=exc)
        return outcomes.unconfirmed(msg, 1, redact(self._url), exc)

    async def publish_many(
        self, messages: Iterable[Message], *, window: int = 1000
    ) -> list[Receipt]:
        """Publish a batch with up to ``window`` confirms outstanding.

        ``window`` is lowered where the publisher's ``in_flight`` bound needs it.
        Every message is validated before any is sent. Returns receipts in input
        order, or raises :class:`~delayq.errors.PublishBatchError` naming each
        message that was not confirmed (the others were).
        """
        window = check_window(window)
        return [
            m.receipt for m in await self._send_batch(self._factory.build_many(messages), window)
        ]

    async def _send_batch(self, built: list[OutgoingMessage], window: int) -> list[OutgoingMessage]:
        """Send built messages with pipelined confirms; returns them as sent (restamped
        if they waited for room)."""
        if not built:
            return []
        # The batch reserves room for what it keeps unconfirmed at once (its window,
        # lowered to fit the byte bound), not for all of it.
        window = batch_window(self._admission.limit, built, max(1, window))
        room = window * max(size_of(m) for m in built)
        with self._observers.reporting(built), traced(self._tracing, built, keep=False):
            async with self._admission.hold(window, room) as waited:
                if waited:  # its delays count from now, not from when it was built
                    built = self._factory.restamp(built)

                async def send(part: Sequence[OutgoingMessage]) -> None:
                    try:
                        await self._link.send_batch(list(part), window)
                    except DelayqError:
                        raise
                    except Exception as exc:
                        failures = {i: self._unexpected(exc, m) for i, m in enumerate(part)}
                        raise PublishBatchError([None] * len(part), failures) from exc

                if self.schedule is None:
                    await send(built)
                else:
                    await arecord_batch(self.schedule, self.topology, built, self._clock_ms, send)
        return built

    # Cancelling ---------------------------------------------------------------

    async def cancel(
        self,
        *,
        message_id: str | None = None,
        key: str | None = None,
        routing_key: str | None = None,
        queues: Iterable[str] | None = None,
        key_scope: KeyScope | str = KeyScope.QUEUE,
    ) -> CancelReceipt:
        """:meth:`Publisher.cancel <delayq.sync.Publisher.cancel>` on asyncio (a store that
        does I/O is called in a thread)."""
        found = await self.cancel_many(
            **one_of(message_id, key), routing_key=routing_key, queues=queues, key_scope=key_scope
        )
        return found[0]

    async def cancel_many(
        self,
        *,
        message_ids: Iterable[str] | None = None,
        keys: Iterable[str] | None = None,
        routing_key: str | None = None,
        queues: Iterable[str] | None = None,
        key_scope: KeyScope | str = KeyScope.QUEUE,
    ) -> list[CancelReceipt]:
        """:meth:`cancel` for many messages, in one store round trip; a receipt each."""
        store = store_for_cancels(self.store)
        plan = plan_cancels(
            self.topology,
            now_ms=self._clock_ms(),
            message_ids=message_ids,
            keys=keys,
            routing_key=routing_key,
            queues=queues,
            key_scope=key_scope,
        )
        receipts = plan.receipts(await self._run_cancels(store, plan.ops))
        await self._index(lambda index: index.cancelled(receipts, self._clock_ms()))
        return receipts

    async def reschedule(
        self,
        body: object,
        routing_key: str,
        delay: object = None,
        *,
        due_at: datetime | None = None,
        message_id: str | None = None,
        key: str | None = None,
        queues: Iterable[str] | None = None,
        key_scope: KeyScope | str = KeyScope.QUEUE,
        headers: Mapping[str, Any] | None = None,
        strategy: Strategy | str | None = None,
        generation: int | None = None,
    ) -> RescheduleReceipt:
        """Move a scheduled message to ``delay`` from now (or to ``due_at``, a ``datetime``
        with its time zone): its older copies are cancelled
        and a new one (``body`` and ``routing_key`` again: a parked message cannot be read
        back) is published, so exactly one copy is handled, also when the new time is
        earlier. Nothing is published when no queue took the mark (the receipt's
        ``marks`` says why). The broker is reached (and the topology's apply checked)
        before anything is marked; if the publish fails after the marks, the older copies
        stay cancelled: reschedule again. ``generation`` defaults to this publisher's clock
        (kept increasing). See ``docs/concepts/cancel.md``.
        """
        store = store_for_cancels(self.store)
        todo = plan_reschedule(
            self._factory,
            self._generations,
            self._clock_ms(),
            body,
            routing_key,
            delay,
            message_id=message_id,
            key=key,
            queues=queues,
            key_scope=key_scope,
            headers=headers,
            strategy=strategy,
            generation=generation,
            due_at=due_at,
        )
        await self._link.connect()  # an unreachable broker or unapplied topology: no marks
        marks, publishable = todo.marks(await self._run_cancels(store, todo.plan.ops))
        if not publishable:
            return todo.receipt(marks, None)
        sent = await self._send(todo.message, keep=True)
        done = todo.receipt(marks, sent.receipt)
        await self._index(lambda index: index.rescheduled([done], self._clock_ms()))
        return done

    async def reschedule_many(
        self,
        items: Iterable[Reschedule],
        *,
        key_scope: KeyScope | str = KeyScope.QUEUE,
        window: int = 1000,
    ) -> list[RescheduleReceipt]:
        """:meth:`Publisher.reschedule_many <delayq.sync.Publisher.reschedule_many>` on
        asyncio (a store that does I/O is called in a thread)."""
        store = store_for_cancels(self.store)
        todo = plan_reschedules(
            self._factory, self._generations, self._clock_ms(), items, key_scope=key_scope
        )
        if not todo.items:
            return []
        await self._link.connect()  # an unreachable broker or unapplied topology: no marks
        marks = todo.marks(await self._run_cancels(store, todo.ops))
        indices = todo.publishable(marks)
        try:
            sent = await self._send_batch(todo.messages(indices), window)
        except PublishBatchError as exc:
            raise todo.failed(marks, indices, exc) from exc
        done = todo.receipts(marks, {i: m.receipt for i, m in zip(indices, sent, strict=True)})
        await self._index(lambda index: index.rescheduled(done, self._clock_ms()))
        return done

    async def _index(self, write: Callable[[ScheduleIndex], None]) -> None:
        """A cancel's or reschedule's write to the schedule index, if any (in a thread
        for a store that blocks)."""
        index = self.schedule
        if index is None:
            return
        if getattr(index.store, "blocking", True):
            await asyncio.to_thread(write, index)
        else:
            write(index)

    @staticmethod
    async def _run_cancels(store: CancellingStore, ops: list[Cancel]) -> list[CancelStatus]:
        """``ops`` in one store batch, in a thread for a store that does I/O."""
        if getattr(store, "blocking", True):
            return await asyncio.to_thread(run_cancels, store, ops)
        return run_cancels(store, ops)
