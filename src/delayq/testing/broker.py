"""An in-memory RabbitMQ with a virtual clock, for testing handlers in milliseconds.

What it models, with RabbitMQ's semantics, because delayq relies on it:

- exchanges (direct, fanout, topic with ``*`` and ``#``), the default exchange
  (routes by queue name), exchange-to-exchange bindings (the exact cascade),
  and ``alternate-exchange`` for what an exchange's own bindings do not take;
- queues with ``x-message-ttl`` and messages with a per-message ``expiration``
  (expiry at the head only, as in RabbitMQ, which is why delayq never mixes
  delays in one queue), ``x-dead-letter-exchange``
  and ``x-dead-letter-routing-key`` (the original key when unset), an
  ``x-death`` header like RabbitMQ's, ``x-max-length`` with ``reject-publish``
  (a nack) or ``drop-head``, and ``x-delivery-limit`` on quorum queues;
- mandatory publishes: a message no queue takes is returned (``Unroutable``),
  a missing exchange closes the channel (``TopologyMissing``).

What it does not model: connections and their failures (but
:meth:`MemoryBroker.fail_publishes` makes publishes fail as a nack or a lost
confirm would), concurrency (handlers run one at a time, inline), priorities, streams,
and the headers exchange.

Time moves only when a test moves it: :meth:`MemoryBroker.advance` expires
queue heads in due order (ties in publish order), dead-letters them, and
delivers what is ready to the consumers attached to the broker, running their
handlers until nothing more is ready at that instant.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from delayq.durations import to_ms
from delayq.errors import (
    ConnectionFailed,
    InvalidInput,
    PublishBatchError,
    PublishError,
    PublishRejected,
    TopologyMissing,
    Unroutable,
)
from delayq.message import outcomes
from delayq.message.envelope import OutgoingMessage
from delayq.testing._views import BrokerViews
from delayq.testing.clock import DEFAULT_START_MS, VirtualClock
from delayq.testing.dispatch import Dispatch, NoProgress, Subscriber
from delayq.testing.entities import Dropped, Entities
from delayq.testing.model import StoredMessage
from delayq.topology.declarations import (
    BindingDecl,
    Declaration,
    build_declarations,
)
from delayq.topology.marker import Gate
from delayq.topology.model import Topology
from delayq.topology.report import ApplyReport, ApplyResult, ApplyStatus, spoils_marker
from delayq.urls import MEMORY_SCHEME, memory_broker_name

if TYPE_CHECKING:
    from delayq.aio.consumer import AsyncConsumer
    from delayq.aio.publisher import AsyncPublisher
    from delayq.sync.consumer import Consumer
    from delayq.sync.publisher import Publisher
    from delayq.worker import Worker

__all__ = ["Dropped", "MemoryBroker", "NoProgress", "Subscriber", "broker_for", "send_batch"]


@dataclass
class _Fault:
    exchange: str | None
    kind: str
    left: int


_BROKERS: dict[str, MemoryBroker] = {}
_NAMES = itertools.count(1)


def broker_for(url: str) -> MemoryBroker:
    """The open :class:`MemoryBroker` a ``memory://NAME`` URL names."""
    name = memory_broker_name(url)
    if name is None:
        raise InvalidInput(f"{url!r} is not a memory broker URL (memory://NAME)")
    try:
        return _BROKERS[name]
    except KeyError:
        raise TopologyMissing(
            f"no memory broker named {name!r} is open: create delayq.testing.MemoryBroker"
            f"({name!r}) first (or use the memory_broker pytest fixture and its .url)"
        ) from None


class MemoryBroker(BrokerViews):
    """An in-memory broker with a virtual clock; its :attr:`url` works wherever a
    broker URL does (``Publisher``, ``Consumer``, ``AsyncPublisher``,
    ``AsyncConsumer``, ``apply_topology``).

    >>> broker = MemoryBroker()
    >>> broker.apply(Topology(namespace="shop", ladder=["1m", "15m"],
    ...     destinations=[{"queue": "emails", "bindings": ["email.*"]}])).summary()
    '19 created, 10 bound'
    >>> broker.close()
    """

    def __init__(self, name: str | None = None, *, start: datetime | int | None = None) -> None:
        if name is None:
            name = f"broker-{next(_NAMES)}"
        if not name or "/" in name:
            raise InvalidInput(f"memory broker name {name!r} must be non-empty, without '/'")
        if name in _BROKERS:
            raise InvalidInput(f"a memory broker named {name!r} is already open")
        if isinstance(start, datetime):
            start_ms = int(start.timestamp() * 1000)
        else:
            start_ms = DEFAULT_START_MS if start is None else start
        self.name = name
        self.clock = VirtualClock(start_ms)
        self._started_ms = start_ms
        self._world = Entities(name, self.clock)
        self._exchanges = self._world.exchanges
        self._queues = self._world.queues
        self._dispatch = Dispatch(self._world, self.clock)
        self._faults: list[_Fault] = []
        self.dropped: list[Dropped] = self._world.dropped
        """Messages the broker discarded (see :class:`Dropped`)."""
        _BROKERS[name] = self

    def __repr__(self) -> str:
        return f"MemoryBroker({self.name!r}, now={self.now.isoformat()})"

    @property
    def url(self) -> str:
        """``memory://NAME``: give it to delayq where a broker URL goes."""
        return f"{MEMORY_SCHEME}://{self.name}"

    def close(self) -> None:
        """Forget the broker: its URL no longer resolves, its consumers are detached."""
        for subscriber in list(self._dispatch.subscribers):
            self.unsubscribe(subscriber)
        if _BROKERS.get(self.name) is self:
            del _BROKERS[self.name]

    def __enter__(self) -> MemoryBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Time -------------------------------------------------------------------------

    def clock_ms(self) -> int:
        """The virtual time in epoch ms (the memory adapters' ``clock_ms``)."""
        return self.clock.now_ms()

    @property
    def now_ms(self) -> int:
        return self.clock.now_ms()

    @property
    def now(self) -> datetime:
        """The virtual time (aware, UTC)."""
        return self.clock.now

    @property
    def elapsed_ms(self) -> int:
        """Virtual time since the broker was created."""
        return self.clock.now_ms() - self._started_ms

    # Topology -----------------------------------------------------------------------

    def apply(self, topology: Topology, *, raise_on_conflict: bool = True) -> ApplyReport:
        """Declare ``topology`` from the same declarations the real provisioning applies,
        in the same two phases: nothing is declared while an entity conflicts."""
        decls = build_declarations(topology)
        found = [self._world.check(decl) for decl in decls]
        conflicted = any(r is not None and r.conflict is not None for r in found)
        report = ApplyReport()
        for decl, result in zip(decls, found, strict=True):
            if result is None:
                status = ApplyStatus.SKIPPED
                result = ApplyResult(decl, status) if conflicted else self.declare(decl)
            report.results.append(result)
        if found[-1] is not None and spoils_marker(topology, report.results):
            del self._exchanges[decls[-1].name]
            report.marker_removed = True
        if raise_on_conflict:
            report.raise_for_conflicts()
        return report

    def declare(self, decl: Declaration) -> ApplyResult:
        """Declare one exchange, queue or binding (idempotent, like RabbitMQ)."""
        return self._world.declare(decl)

    def bind(self, binding: BindingDecl) -> None:
        self._world.bind(binding)

    def delete_queue(self, name: str) -> None:
        """Delete a queue and the bindings to it (its messages are gone)."""
        self._world.delete_queue(name)

    def check_applied(self, gate: Gate) -> None:
        """What a real publisher checks on each connection: its topology's apply marker
        (raises :class:`~delayq.errors.TopologyNotApplied` when it is missing)."""
        if gate.marker not in self._exchanges:
            raise gate.refusal()

    # Publishing ---------------------------------------------------------------------

    def publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        *,
        content_type: str | None = None,
        message_id: str | None = None,
        timestamp_s: int | None = None,
        headers: Mapping[str, Any] | None = None,
        expiration_ms: int | None = None,
        mandatory: bool = True,
    ) -> list[str]:
        """Publish like ``basic.publish`` with confirms; return the queues that took it.

        Raises :class:`~delayq.errors.TopologyMissing` for a missing exchange,
        :class:`~delayq.errors.Unroutable` (mandatory, no queue took it) and
        :class:`~delayq.errors.PublishRejected` (a full ``reject-publish`` queue).
        ``expiration_ms`` is the per-message TTL (AMQP ``expiration``), expired at the
        head only, as RabbitMQ does.
        """
        message = StoredMessage(
            body=bytes(body),
            exchange=exchange,
            routing_key=routing_key,
            content_type=content_type,
            message_id=message_id,
            timestamp_s=timestamp_s,
            headers=dict(headers or {}),
            seq=0,
            expiration_ms=expiration_ms,
        )
        route = self._world.route(exchange, routing_key, message.headers)
        self._world.enqueue(message, route)
        if route.rejected:
            names = ", ".join(q.name for q in route.rejected)
            raise PublishRejected(
                f"the memory broker nacked message {message_id!r}: queue {names} is full "
                "(x-overflow reject-publish)",
                message_id,
            )
        if mandatory and not route.queues:
            raise Unroutable(
                f"exchange {exchange!r} has no queue bound to take message {message_id!r} "
                f"(routing key {routing_key!r})",
                message_id,
            )
        return [q.name for q in route.queues]

    def fail_publishes(
        self, count: int = 1, *, exchange: str | None = None, kind: str = "rejected"
    ) -> None:
        """Make the next ``count`` publishes by delayq's publishers (to ``exchange``, or
        any) fail: ``kind`` ``"rejected"`` (a nack: ``PublishRejected``) or
        ``"unconfirmed"`` (``PublishUnconfirmed``, as when the connection drops before
        the confirm). Nothing is enqueued. For testing producers' error handling and the
        consumers' return-to-queue path."""
        if kind not in ("rejected", "unconfirmed"):
            raise InvalidInput(f"kind must be 'rejected' or 'unconfirmed', not {kind!r}")
        if count < 1:
            raise InvalidInput(f"count must be at least 1, got {count!r}")
        self._faults.append(_Fault(exchange, kind, count))

    def _injected(self, msg: OutgoingMessage) -> PublishError | None:
        for fault in self._faults:
            if fault.exchange is None or fault.exchange == msg.exchange:
                fault.left -= 1
                if fault.left == 0:
                    self._faults.remove(fault)
                if fault.kind == "rejected":
                    return outcomes.rejected(msg, "a failure injected by the test")
                return outcomes.unconfirmed(msg, 1, self.url, None)
        return None

    def send(self, msg: OutgoingMessage) -> None:
        """Publish a message built by delayq, with the errors a real publisher raises."""
        if _BROKERS.get(self.name) is not self:
            raise ConnectionFailed(f"memory broker {self.name!r} is closed")
        injected = self._injected(msg)
        if injected is not None:
            raise injected
        try:
            self.publish(
                msg.exchange,
                msg.routing_key,
                msg.body,
                content_type=msg.content_type,
                message_id=msg.message_id,
                timestamp_s=msg.timestamp_s,
                headers=msg.headers,
            )
        except Unroutable as exc:
            raise outcomes.unroutable(msg) from exc
        except PublishRejected as exc:
            raise outcomes.rejected(msg, str(exc)) from exc

    # Dead-lettering -------------------------------------------------------------------

    # Consumers ----------------------------------------------------------------------

    def subscribe(self, subscriber: Subscriber) -> None:
        """Attach a consumer: it receives ``subscriber.queue``'s messages when the broker runs."""
        self._dispatch.subscribe(subscriber)

    def unsubscribe(self, subscriber: Subscriber) -> None:
        """Detach a consumer; what it holds unacked goes back to its queue."""
        self._dispatch.unsubscribe(subscriber)

    def ack(self, tag: int, *, multiple: bool = False) -> None:
        self._dispatch.ack(tag, multiple=multiple)

    def nack(self, tag: int, *, requeue: bool) -> None:
        self._dispatch.nack(tag, requeue=requeue)

    # Running ------------------------------------------------------------------------

    def advance(self, by: object) -> None:
        """Move the clock forward by ``by`` (``"15m"``, a ``timedelta``), expiring and
        delivering what falls due in due order, then whatever is ready at the end.

        Consumers' handlers run inline. With async consumers attached use
        :meth:`advance_async`.
        """
        ms = to_ms(by, what="advance")
        self._dispatch.run_sync(self._dispatch.steps(self.clock.now_ms() + ms))

    async def advance_async(self, by: object) -> None:
        """:meth:`advance` for async consumers (sync ones run too)."""
        ms = to_ms(by, what="advance")
        await self._dispatch.run_async(self._dispatch.steps(self.clock.now_ms() + ms))

    def run_until_idle(self, *, max: object = "24h") -> bool:
        """Run until nothing waits or is ready (True), or ``max`` of virtual time passed
        (False). The clock stops at the last event, not at ``max``."""
        limit = self.clock.now_ms() + to_ms(max, what="max")
        self._dispatch.run_sync(self._dispatch.steps(limit, idle_stops=True))
        return self._dispatch.idle()

    async def run_until_idle_async(self, *, max: object = "24h") -> bool:
        limit = self.clock.now_ms() + to_ms(max, what="max")
        await self._dispatch.run_async(self._dispatch.steps(limit, idle_stops=True))
        return self._dispatch.idle()

    def run_until(self, done: Callable[[], bool], *, max: object = "24h") -> bool:
        """Run event by event until ``done()`` (True) or ``max`` of virtual time (False);
        the clock stays at the event after which ``done()`` held."""
        limit = self.clock.now_ms() + to_ms(max, what="max")
        self._dispatch.run_sync(self._dispatch.steps(limit, done=done))
        return done()

    async def run_until_async(
        self,
        done: Callable[[], bool],
        *,
        max: object = "24h",
    ) -> bool:
        limit = self.clock.now_ms() + to_ms(max, what="max")
        await self._dispatch.run_async(self._dispatch.steps(limit, done=done))
        return done()

    # Factories ----------------------------------------------------------------------

    def publisher(self, topology: Topology, **options: Any) -> Publisher:
        """A :class:`~delayq.sync.Publisher` on this broker (same options)."""
        from delayq.sync.publisher import Publisher

        return Publisher(self.url, topology, **options)

    def consumer(
        self, topology: Topology, queue: str, handler: Callable[..., Any], **options: Any
    ) -> Consumer:
        """A started :class:`~delayq.sync.Consumer` on this broker (same options)."""
        from delayq.sync.consumer import Consumer

        consumer = Consumer(self.url, topology, queue, handler, **options)
        consumer.start()
        return consumer

    def async_publisher(self, topology: Topology, **options: Any) -> AsyncPublisher:
        from delayq.aio.publisher import AsyncPublisher

        return AsyncPublisher(self.url, topology, **options)

    async def async_consumer(
        self, topology: Topology, queue: str, handler: Callable[..., Any], **options: Any
    ) -> AsyncConsumer:
        """A started :class:`~delayq.aio.AsyncConsumer` on this broker (same options)."""
        from delayq.aio.consumer import AsyncConsumer

        consumer = AsyncConsumer(self.url, topology, queue, handler, **options)
        await consumer.start()
        return consumer

    def attach(self, worker: Worker) -> list[Consumer]:
        """Start a consumer for every handler of ``worker`` (plain functions), with the
        options ``worker.run`` would give them; ``advance`` then runs them."""
        if any(r.is_async for r in worker.registrations):
            raise InvalidInput(
                "the worker has coroutine handlers: use `await broker.attach_async(worker)`"
            )
        return [
            self.consumer(worker.topology, r.queue, r.handler, **worker.consumer_options(r))
            for r in worker.registrations
        ]

    async def attach_async(self, worker: Worker) -> list[Consumer | AsyncConsumer]:
        """:meth:`attach` for a worker with coroutine handlers (``Consumer`` for plain
        ones, ``AsyncConsumer`` for coroutines, as ``worker.run`` does)."""
        started: list[Consumer | AsyncConsumer] = []
        for r in worker.registrations:
            options = worker.consumer_options(r)
            if r.is_async:
                started.append(
                    await self.async_consumer(worker.topology, r.queue, r.handler, **options)
                )
            else:
                started.append(self.consumer(worker.topology, r.queue, r.handler, **options))
        return started


def send_batch(broker: MemoryBroker, built: list[OutgoingMessage]) -> None:
    """Publish a built batch; raise :class:`~delayq.errors.PublishBatchError` naming the
    messages that were not taken (the others were), like the real pipelined publishers."""
    failures: dict[int, PublishError] = {}
    for index, msg in enumerate(built):
        try:
            broker.send(msg)
        except PublishError as exc:
            failures[index] = exc
    if failures:
        receipts = [None if i in failures else m.receipt for i, m in enumerate(built)]
        raise PublishBatchError(receipts, failures)
