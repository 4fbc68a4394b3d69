"""The blocking publisher: every publish confirmed, retried on a fresh connection.

The publisher builds and checks messages and reports their outcomes; its link
(:mod:`delayq.links`, pika's by default: :mod:`delayq.sync._link`) does the I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from functools import partial
from types import TracebackType
from typing import Any

from delayq.contexts import NoAsyncContext
from delayq.durations import Duration
from delayq.errors import PublishBatchError, PublishError
from delayq.forking import abandon, forget_in_children
from delayq.links import Link, LinkOptions, Settle, SettleGuard, gate_for, open_link
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
from delayq.message.inflight import InFlightLimit, batch_window, check_window, limit_or_default
from delayq.message.reschedule import Reschedule, plan_reschedules
from delayq.observe.publishes import PublishObserver, PublishObservers
from delayq.observe.tracing import TracingOption, traced, tracing_for
from delayq.retrying import within_seconds
from delayq.schedule.record import ScheduleIndex, recorded_stream, recording
from delayq.stores.base import IdempotencyStore, run_cancels
from delayq.stores.key_scope import KeyScope
from delayq.sync._connection import BLOCKED_CONNECTION_TIMEOUT_S
from delayq.sync._shared import ThreadSafeSends
from delayq.topology.model import Strategy, Topology
from delayq.urls import redact, resolve_url

__all__ = ["Publisher"]


class Publisher(NoAsyncContext):
    """Publishes delayed messages through pika, one confirmed publish at a time.

    >>> with Publisher("amqp://guest:guest@localhost/", topology) as pub:  # doctest: +SKIP
    ...     receipt = pub.publish({"order": 42}, "orders.remind", "15m")

    ``publish_many`` pipelines confirms and is several times faster for batches.

    Thread-safe: ``publish`` and ``send`` may be called from many threads at once
    (a web application's workers sharing one publisher). One caller at a time uses
    the blocking channel; a thread that finds it busy hands its message to a second,
    pipelined connection that the publisher opens at the first such overlap and
    keeps, run by its own I/O thread, and waits for its own confirm there: the same
    errors, observers, spans, in-flight bound and ``reconnect_within`` as a single
    publish (see ``docs/guides/publishing.md``). :meth:`close` lets what threads have
    queued finish (each hears its outcome) and ends that thread.

    Bodies and headers are checked against ``topology.limits`` before anything
    is sent (see :mod:`delayq.message.limits`); ``max_body_bytes`` overrides the body
    limit. ``url`` may be ``amqps://`` with TLS options (see :mod:`delayq.tls`).
    ``observers`` see each message's outcome (see :mod:`delayq.observe.publishes`).
    ``link`` replaces the broker I/O (see :mod:`delayq.links`); by default the
    URL's scheme chooses it (``amqp``, ``amqps``, ``memory``).

    ``reconnect_within``: how long a lost broker is waited for once connected (30 s;
    ``None``: ``connect_attempts`` rounds, as for a first connection); the rules and
    what a batch then reports are in :mod:`delayq.retrying`.

    ``in_flight`` bounds what a batch or stream keeps sent but unconfirmed (10,000
    messages or 64 MiB by default, lowering ``window`` where needed): the caller
    waits while confirms are behind, since a stream is pulled only as confirms
    free room (see :mod:`delayq.message.inflight`).

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
        blocked_timeout_s: float = BLOCKED_CONNECTION_TIMEOUT_S,
        clock_ms: Callable[[], int] = epoch_ms,
        new_id: Callable[[], str] = new_message_id,
        observers: Iterable[PublishObserver] = (),
        link: Link | None = None,
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
        self._in_flight = limit_or_default(in_flight)
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
                blocked_timeout_s=blocked_timeout_s,
                max_in_flight_bytes=self._in_flight.bytes,
            )
            link = open_link(self._url, self._gate, options)
        self._link = link
        self._sends = ThreadSafeSends(link, self._in_flight.messages)
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
        return f"Publisher(url={redact(self._url)!r}, namespace={self.topology.namespace!r})"

    # Connection ---------------------------------------------------------------

    def _forget_inherited(self) -> None:
        """In a forked child (:mod:`delayq.forking`): a connection of its own next time."""
        assert self._options is not None
        abandon((self._link, self._sends))
        self._link = open_link(self._url, self._gate, self._options)
        self._sends = ThreadSafeSends(self._link, self._in_flight.messages)

    def connect(self) -> None:
        """Open the connection now instead of at the first publish."""
        self._sends.connect()

    @property
    def link(self) -> Link:
        """What this publisher sends through (see :mod:`delayq.links`)."""
        return self._link

    def close(self) -> None:
        """Close the connection; later publishes reconnect.

        Threads waiting in :meth:`publish` hear their outcome first: what they queued
        on the shared connection is still sent and confirmed (or fails as a publish
        does, within ``reconnect_within``); its I/O thread then ends."""
        self._sends.close()

    def __enter__(self) -> Publisher:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # Publishing ---------------------------------------------------------------

    def publish(
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

        ``body`` is bytes, a str (sent as UTF-8 text), a pydantic model or a JSON value
        (dict, list, tuple, number, bool, None). JSON has only str keys: a dict with
        any other key (``{1: "a"}``, which would arrive as ``{"1": "a"}``) is refused
        with :class:`~delayq.errors.InvalidBody`; a tuple arrives as a list.
        ``delay`` is a ``timedelta`` or a string like ``"90s"``; ``"0s"`` is
        immediate. ``strategy`` (``"tiered"`` or ``"exact"``) overrides the
        topology's default for this message. Raises a
        :class:`~delayq.errors.InvalidInput` subclass before sending anything on
        bad input, :class:`~delayq.errors.Unroutable`,
        :class:`~delayq.errors.PublishRejected`,
        :class:`~delayq.errors.TopologyMissing`,
        :class:`~delayq.errors.AccessRefused` (the user may not publish there) or
        :class:`~delayq.errors.PublishUnconfirmed` when the broker did not take it.
        """
        msg = self._factory.build(
            body, routing_key, delay, message_id=message_id, headers=headers, strategy=strategy
        )
        with self._observers.reporting([msg]), traced(self._tracing, [msg], keep=False):
            self._send_one(msg)
        return msg.receipt

    def send(self, msg: OutgoingMessage) -> None:
        """Send an already built message with confirm and bounded retries (one that
        carries a ``traceparent`` keeps it: a retry, a replay stays in its trace)."""
        with self._observers.reporting([msg]), traced(self._tracing, [msg], keep=True):
            self._send_one(msg)

    def _send_one(self, msg: OutgoingMessage) -> None:
        if self.schedule is None:
            self._sends.send(msg)
            return
        with recording(self.schedule, self.topology, [msg], self._clock_ms):
            self._sends.send(msg)

    def publish_many(self, messages: Iterable[Message], *, window: int = 1000) -> list[Receipt]:
        """Publish a batch with pipelined confirms (up to ``window`` unconfirmed).

        Every message is validated before any is sent. Returns receipts in input
        order, or raises :class:`~delayq.errors.PublishBatchError` naming each
        message that was not confirmed (the others were).
        """
        window = check_window(window)
        return [m.receipt for m in self._send_batch(self._factory.build_many(messages), window)]

    def _send_batch(self, built: list[OutgoingMessage], window: int) -> list[OutgoingMessage]:
        """Send built messages with pipelined confirms; returns them as sent."""
        if built:
            window = batch_window(self._in_flight, built, max(1, window))
            with self._observers.reporting(built), traced(self._tracing, built, keep=False):
                if self.schedule is None:
                    self._link.send_batch(built, window)
                else:
                    with recording(self.schedule, self.topology, built, self._clock_ms):
                        self._link.send_batch(built, window)
        return built

    def send_many(
        self,
        messages: Iterable[OutgoingMessage],
        *,
        settle: Settle,
        window: int = 1000,
    ) -> None:
        """Stream already built messages through one connection with pipelined confirms.

        ``messages`` is pulled lazily, at most ``window`` unconfirmed at a time,
        so a generator of millions needs little memory; build them with
        ``publisher.factory`` (or :class:`~delayq.message.bulk.BulkPlanner`), which
        validates each before it reaches the stream. ``settle(index, message,
        error)`` is called once per message: ``error`` is ``None`` when the
        broker confirmed it, else the :class:`~delayq.errors.PublishError`
        (rejected, unroutable, or unconfirmed once the retries are spent).
        Raises :class:`~delayq.errors.ConnectionFailed` when nothing could be
        sent, :class:`~delayq.errors.TopologyMissing` or
        :class:`~delayq.errors.AccessRefused` at once. The publisher's
        ``observers`` hear each message's outcome as it settles. An exception raised by
        ``settle`` ends the stream: nothing more is pulled, what is in flight settles
        (still told to ``settle``), and ``send_many`` raises it. With a
        ``schedule`` index, the stream is recorded ``window`` messages at a time (each
        slice pending before it is sent, moved once it settled:
        :func:`~delayq.schedule.record.recorded_stream`).

        >>> failed = []                                           # doctest: +SKIP
        >>> pub.send_many((pub.factory.build(b, "job.x", "1m") for b in bodies),
        ...               settle=lambda i, m, e: e and failed.append((i, e)))  # doctest: +SKIP
        """
        guard = SettleGuard(settle)  # an exception of settle's ends the stream, raised
        settle, messages = guard, guard.pulling(messages)
        if self._observers:
            observed = settle

            def settle(index: int, msg: OutgoingMessage, error: PublishError | None) -> None:
                self._observers.emit([msg], error)
                observed(index, msg, error)

        window = max(1, min(window, self._in_flight.messages))
        send = self._link.send_stream
        if self.schedule is not None:  # recorded a window at a time (recorded_stream)
            send = partial(recorded_stream, self.schedule, self.topology, send=send,
                           now_ms=self._clock_ms)  # fmt: skip
        if self._tracing is None:
            send(messages, settle, window)
            guard.raise_first()
            return
        spans = self._tracing.streaming()
        told = settle

        def ended(index: int, msg: OutgoingMessage, error: PublishError | None) -> None:
            spans.settled(index, error)
            told(index, msg, error)

        failed: BaseException | None = None
        try:
            send(spans.pulled(messages), ended, window)
        except BaseException as exc:
            failed = exc
            raise
        finally:
            spans.close(failed)
        guard.raise_first()

    @property
    def in_flight(self) -> InFlightLimit:
        """The bound on what a batch or stream holds unconfirmed."""
        return self._in_flight

    @property
    def factory(self) -> MessageFactory:
        """The pure builder this publisher validates and builds messages with."""
        return self._factory

    # Cancelling ---------------------------------------------------------------

    def cancel(
        self,
        *,
        message_id: str | None = None,
        key: str | None = None,
        routing_key: str | None = None,
        queues: Iterable[str] | None = None,
        key_scope: KeyScope | str = KeyScope.QUEUE,
    ) -> CancelReceipt:
        """Cancel one scheduled message by ``message_id`` or by business ``key``, in the
        store given as ``store=``: its handler will not run, unless the receipt says it
        ran (``already handled``) or runs (``in progress``). See ``docs/concepts/cancel.md``.

        >>> receipt = publisher.cancel(message_id="m-42")  # doctest: +SKIP
        >>> receipt.status, receipt.cancelled               # doctest: +SKIP
        (<CancelStatus.UNKNOWN: 'unknown'>, True)
        """
        found = self.cancel_many(
            **one_of(message_id, key), routing_key=routing_key, queues=queues, key_scope=key_scope
        )
        return found[0]

    def cancel_many(
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
        receipts = plan.receipts(run_cancels(store, plan.ops))
        if self.schedule is not None:
            self.schedule.cancelled(receipts, self._clock_ms())
        return receipts

    def reschedule(
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
        self._link.connect()  # an unreachable broker or unapplied topology: nothing marked
        marks, publishable = todo.marks(run_cancels(store, todo.plan.ops))
        if not publishable:
            return todo.receipt(marks, None)
        self.send(todo.message)
        done = todo.receipt(marks, todo.message.receipt)
        if self.schedule is not None:
            self.schedule.rescheduled([done], self._clock_ms())
        return done

    def reschedule_many(
        self,
        items: Iterable[Reschedule],
        *,
        key_scope: KeyScope | str = KeyScope.QUEUE,
        window: int = 1000,
    ) -> list[RescheduleReceipt]:
        """:meth:`reschedule` for many messages (:class:`~delayq.Reschedule` items): every
        item checked first (bad input anywhere marks nothing), the marks in one store round
        trip, then the new copies whose mark took in one pipelined batch (up to ``window``
        unconfirmed). Returns a receipt per item in input order (``moved`` false: nothing
        published, ``marks`` says why), or raises :class:`~delayq.errors.PublishBatchError`
        whose ``receipts`` hold the others' receipts and ``failures`` each item whose new
        copy was not confirmed (its older copies stay cancelled: reschedule it again). As
        for :meth:`reschedule`, an unreachable broker raises before anything is marked.
        """
        store = store_for_cancels(self.store)
        todo = plan_reschedules(
            self._factory, self._generations, self._clock_ms(), items, key_scope=key_scope
        )
        if not todo.items:
            return []
        self._link.connect()  # an unreachable broker or unapplied topology: nothing marked
        marks = todo.marks(run_cancels(store, todo.ops))
        indices = todo.publishable(marks)
        try:
            sent = self._send_batch(todo.messages(indices), window)
        except PublishBatchError as exc:
            raise todo.failed(marks, indices, exc) from exc
        done = todo.receipts(marks, {i: m.receipt for i, m in zip(indices, sent, strict=True)})
        if self.schedule is not None:
            self.schedule.rescheduled(done, self._clock_ms())
        return done
