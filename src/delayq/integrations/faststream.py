"""FastStream on RabbitMQ with delays and retries in delayq's tiers
(``pip install 'delayq[faststream]'``).

FastStream has no delay of its own: its users declare the delayed-message-exchange
plugin's ``x-delayed-message`` exchange and publish with an ``x-delay`` header
(ag2ai/faststream #1668), which a broker without the plugin refuses (RabbitMQ 4.3 cannot
have it). :class:`DelayqBroker` is FastStream's ``RabbitBroker`` whose publishes with an
``x-delay`` header (milliseconds, the plugin's contract) wait in the tier at or above it,
then reach the subscribers' queues through ``<ns>.ready``; a subscriber on a queue delayq
owns (a topology destination) gets delayq's retries and dead-letter queue.

>>> topology = Topology(namespace="app")
>>> broker = DelayqBroker("amqp://localhost", topology=topology)  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from datetime import timedelta
from typing import Any

from aio_pika import IncomingMessage
from faststream.exceptions import IgnoredException
from faststream.middlewares import BaseMiddleware
from faststream.rabbit import RabbitBroker
from faststream.rabbit.parser import AioPikaParser
from faststream.rabbit.response import RabbitPublishCommand
from faststream.rabbit.testing import FakeProducer
from faststream.response.publish_type import PublishType

from delayq.aio.provision import apply_topology_async
from delayq.aio.publisher import AsyncPublisher
from delayq.consume.delivery import Action, Delivery
from delayq.consume.planner import DeliveryPlanner
from delayq.consume.retry import RetryPolicy
from delayq.errors import DelayTooLong, InvalidDelay, InvalidInput
from delayq.intake.delay import DELAY_HEADERS, BadDelay, read_delay
from delayq.integrations._routes import delayed_key, open_topology
from delayq.topology.cascade import Kind, delivery_binding_key
from delayq.topology.model import Topology
from delayq.urls import resolve_url

__all__ = ["DelayqBroker"]

log = logging.getLogger("delayq.integrations.faststream")

_KEPT = ("content_encoding", "correlation_id", "reply_to", "priority", "type", "app_id")
"""The properties a retry keeps beside delayq's (id, content type, headers)."""
_ROUTED = {"", "direct", "topic", "fanout"}
"""Exchange types whose routing a delayed message keeps: by its routing key (or none)."""


_CONNECTION_ARGS = ("host", "port", "virtualhost", "ssl_options", "security", "client_properties")
"""``RabbitBroker``'s connection arguments beside the URL, which delayq's publisher would
not follow."""


def _kind(exchange: Any) -> str:
    kind = getattr(exchange, "type", "direct")
    return str(getattr(kind, "value", kind))


class DelayqBroker(RabbitBroker):
    """A ``RabbitBroker`` whose delayed publishes and retries go through delayq's tiers.

    ``url`` is RabbitMQ's (``None``: ``$DELAYQ_URL``, else localhost). ``topology`` names
    the namespace and the ladder; it accepts every routing key (``external_bindings:
    ["#"]``) and ``start()`` binds each subscriber's queue to ``<ns>.ready`` by its
    routing key. ``apply=False``: ``delayq topology apply`` did (with
    ``external_bindings: ["#"]``). A subscriber on a queue the topology lists as a
    destination (``RabbitQueue(name, declare=False)``: delayq declared it) gets delayq's
    retries: ``retry`` (default: the topology's default policy) and ``non_retryable``, as
    a delayq consumer. ``publisher_options``: the
    :class:`~delayq.aio.AsyncPublisher`'s keyword arguments. Every other argument is
    ``RabbitBroker``'s.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        topology: Topology,
        apply: bool = True,
        retry: RetryPolicy | None = None,
        non_retryable: tuple[type[BaseException], ...] = (),
        publisher_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        given = sorted(k for k in _CONNECTION_ARGS if kwargs.get(k) is not None)
        if given:
            raise InvalidInput(
                f"DelayqBroker takes the broker's URL alone (delayq's publisher connects by "
                f"it too), not {', '.join(given)}: write them in the URL (amqps:// for TLS)"
            )
        resolved = resolve_url(url)
        super().__init__(resolved, **kwargs)
        self.delayq_topology = open_topology(topology, "FastStream")
        self._delayq_url = resolved
        self._delayq_apply = apply
        self._delayq_retry = retry
        self._delayq_non_retryable = non_retryable
        self._delayq_options = dict(publisher_options or {})
        self._delayq: AsyncPublisher | None = None
        self._delayq_lock = asyncio.Lock()
        self._planners: dict[str, DeliveryPlanner] = {}
        self._owned = {d.queue for d in self.delayq_topology.destinations if not d.existing}
        self._delayq_started = False
        self.add_middleware(self._middleware)

    def _middleware(self, msg: Any, /, *, context: Any) -> _Delayq:
        return _Delayq(msg, context=context, broker=self)

    async def start(self) -> None:
        """delayq's topology (the queues it owns first), FastStream's subscribers, then
        their queues bound to ``<ns>.ready``; refuses a subscriber that would declare a
        queue delayq owns (its arguments would differ)."""
        for sub in self.subscribers:
            queue = getattr(sub, "queue", None)
            if queue is not None and queue.name in self._owned and queue.declare:
                raise InvalidInput(
                    f"subscriber queue {queue.name!r} is a destination of delayq's topology "
                    f"(delayq declares it, with its retries and DLQ): subscribe with "
                    f"RabbitQueue({queue.name!r}, declare=False)"
                )
        await self._publisher()
        for name in self._owned:
            self._planners[name] = DeliveryPlanner(
                self.delayq_topology, name, policy=self._delayq_retry,
                non_retryable=self._delayq_non_retryable,
            )  # fmt: skip
        await super().start()
        for sub in self.subscribers:
            await self._bind(sub)
        self._delayq_started = True

    def subscriber(self, *args: Any, **kwargs: Any) -> Any:
        """FastStream's subscriber; one started after the broker is bound when it starts."""
        sub = super().subscriber(*args, **kwargs)
        start = sub.start

        async def start_and_bind() -> None:
            await start()
            if self._delayq_started:
                await self._bind(sub)

        sub.start = start_and_bind  # type: ignore[method-assign]
        return sub

    async def _bind(self, sub: Any) -> None:
        """``sub``'s queue bound to ``<ns>.ready`` (and the exact cascade's delivery
        exchange) by :func:`delayed_key` of what it is bound by: its name on the default
        exchange, its routing key on a direct or topic one, every key on a fanout. A
        queue delayq owns is bound by the topology."""
        queue = getattr(sub, "queue", None)
        if queue is None or queue.name in self._owned or self._channel is None:
            return
        prefix = sub.routing()[: len(sub.routing()) - len(queue.routing())]
        name = prefix + queue.name
        exchange = getattr(sub, "exchange", None)
        exchange_name = str(getattr(exchange, "name", "") or "")
        kind = _kind(exchange) if exchange_name else ""
        if kind not in _ROUTED:
            return  # a headers exchange: a delayed publish to it is refused
        by = name if not exchange_name else "#" if kind == "fanout" else sub.routing()
        key = delayed_key(exchange_name, by)
        topology = self.delayq_topology
        bindings = [(topology.ready_exchange, key)]
        if topology.exact_enabled:
            levels = topology.exact_levels
            bindings.append(
                (topology.delivery_exchange, delivery_binding_key(levels, Kind.ROUTE, key))
            )
        declared = await self._channel.get_queue(name, ensure=False)
        for exchange_to, binding in bindings:
            await declared.bind(exchange_to, routing_key=binding)

    async def stop(self, *args: Any, **kwargs: Any) -> None:
        """FastStream's subscribers and connection, then delayq's publisher (what it sent
        was confirmed)."""
        self._delayq_started = False
        await super().stop(*args, **kwargs)
        publisher, self._delayq = self._delayq, None
        if publisher is not None:
            await publisher.aclose()

    async def _publisher(self) -> AsyncPublisher:
        """The publisher, opened once (the topology applied first, unless ``apply=False``)."""
        async with self._delayq_lock:
            if self._delayq is None:
                if self._delayq_apply:
                    await apply_topology_async(self.delayq_topology, self._delayq_url)
                publisher = AsyncPublisher(
                    self._delayq_url, self.delayq_topology, **self._delayq_options
                )
                await publisher.connect()
                self._delayq = publisher
            return self._delayq

    async def _delayed(self, cmd: RabbitPublishCommand, delay: timedelta) -> None:
        """``cmd`` encoded as FastStream would, sent (confirmed) through the tier."""
        if cmd.publish_type is PublishType.REQUEST:
            raise InvalidInput("a request waits for its answer: it cannot be delayed")
        exchange = cmd.exchange
        kind = _kind(exchange) if exchange.name else ""
        if kind not in _ROUTED:
            ready = self.delayq_topology.ready_exchange
            raise InvalidInput(
                f"a delayed message reaches its queues through {ready} "
                f"by its routing key, which exchange {exchange.name!r} ({kind}) does not route by: "
                "publish it to a direct, topic or fanout exchange, or to the queue"
            )
        options: dict[str, Any] = dict(cmd.message_options)
        if options.get("expiration") is not None:
            raise InvalidInput("expiration with x-delay: the message would expire in its tier")
        producer = self._producer
        message = await AioPikaParser.encode_message(
            message=cmd.body, serializer=getattr(producer, "serializer", None),
            codec=getattr(producer, "codec", None), reply_to=cmd.reply_to or None,
            headers=cmd.headers, correlation_id=cmd.correlation_id, **options,
        )  # fmt: skip
        publisher = await self._publisher()
        headers = {k: v for k, v in (message.headers or {}).items() if k not in DELAY_HEADERS}
        key = cmd.destination
        if exchange.name or key not in self._owned:
            key = delayed_key(exchange.name, key)
        built = publisher.factory.build(
            message.body, key, delay, message_id=message.message_id, headers=headers
        )
        carried = {"content_type": message.content_type, **_properties(message)}
        await publisher.send(replace(built, properties=_present(carried)))

    async def _failed(self, raw: IncomingMessage, queue: str, error: BaseException) -> bool:
        """A handler's failure on a queue delayq owns: the retry or dead letter sent
        (confirmed) and ``True`` (FastStream acks), or ``False`` (not delayq's queue)."""
        planner = self._planners.get(queue)
        if planner is None:
            return False
        delivery = Delivery(
            queue, raw.body, raw.routing_key or "", raw.message_id, raw.content_type,
            dict(raw.headers or {}), bool(raw.redelivered),
        )  # fmt: skip
        decision = planner.failure(delivery, error)
        if decision.message is None:
            return False
        publisher = await self._publisher()
        carried = _present({k: getattr(raw, k, None) for k in _KEPT})
        await publisher.send(replace(decision.message, properties=carried))
        level = logging.WARNING if decision.action is Action.RETRY else logging.ERROR
        log.log(level, "%s %s: %s", queue, decision.action.value, decision.reason)
        return True


def _properties(message: Any) -> dict[str, Any]:
    return {k: getattr(message, k, None) for k in (*_KEPT, "user_id")}


def _present(properties: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in properties.items() if v is not None and v != ""}


def _delay(headers: dict[str, Any] | None) -> timedelta | None:
    """The delay an ``x-delay`` header (or another the plugin reads) asks for; ``None``
    without one, or for 0 (sent at once, as the plugin does)."""
    if not headers or not any(name in headers for name in DELAY_HEADERS):
        return None
    ms = read_delay(headers)
    if isinstance(ms, BadDelay):
        raise InvalidDelay(f"{ms.reason}: nothing was sent")
    if ms == 0:
        return None
    try:
        return timedelta(milliseconds=ms)
    except OverflowError:
        raise DelayTooLong(f"x-delay {ms} ms is longer than any tier can hold") from None


class _Delayq(BaseMiddleware):
    """Sends a publish with a delay through delayq; turns a handler's failure on a
    queue delayq owns into its retry or dead letter."""

    def __init__(self, msg: Any, /, *, context: Any, broker: DelayqBroker) -> None:
        super().__init__(msg, context=context)
        self._broker = broker

    async def publish_scope(self, call_next: Any, cmd: Any) -> Any:
        delay = _delay(cmd.headers)
        if delay is None or isinstance(self._broker._producer, FakeProducer):  # TestRabbitBroker
            if cmd.headers and any(name in cmd.headers for name in DELAY_HEADERS):
                cmd.headers = {k: v for k, v in cmd.headers.items() if k not in DELAY_HEADERS}
            return await call_next(cmd)
        await self._broker._delayed(RabbitPublishCommand.from_cmd(cmd), delay)
        return None

    async def after_processed(
        self,
        exc_type: type[BaseException] | None = None,
        exc_val: BaseException | None = None,
        exc_tb: Any = None,
    ) -> bool | None:
        if exc_val is None or not isinstance(exc_val, Exception):
            return False
        if isinstance(exc_val, IgnoredException) or not isinstance(self.msg, IncomingMessage):
            return False  # FastStream's own Ack/Nack/Reject/Skip
        if self.msg.processed:
            return False  # the handler acked, nacked or rejected it itself
        handler = self.context.get_local("handler_")
        queue = getattr(getattr(handler, "queue", None), "name", None)
        if queue is None:
            return False
        return await self._broker._failed(self.msg, queue, exc_val)
