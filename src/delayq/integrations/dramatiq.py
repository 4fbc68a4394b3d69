"""Dramatiq on RabbitMQ with its delays in delayq's tiers (``pip install 'delayq[dramatiq]'``).

:class:`DelayqBroker` is Dramatiq's ``RabbitmqBroker`` whose delayed messages
(``send_with_options(delay=...)``, the ``Retries`` middleware's back-off, pipelines) wait
in the tier at or above their delay and reach the actor's queue through ``<ns>.ready``.
Dramatiq's own broker sends them to ``<queue>.DQ``, where a worker holds each one unacked
until its time: past RabbitMQ's ``consumer_timeout`` the broker closes the channel and
every held message is delivered again, over and over until its time (Dramatiq #827).

>>> topology = Topology(namespace="tasks")
>>> broker = DelayqBroker(url="amqp://localhost", topology=topology)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pika
from dramatiq import Actor, Message
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.common import q_name, xq_name
from dramatiq.middleware import Retries
from dramatiq.middleware.retries import DEFAULT_MAX_BACKOFF

from delayq.durations import format_ms
from delayq.errors import DelayTooLong, InvalidDelay, InvalidInput, TopologyMissing
from delayq.integrations._routes import open_topology, park
from delayq.message.envelope import OutgoingMessage
from delayq.sync.provision import apply_topology
from delayq.sync.publisher import Publisher
from delayq.topology.cascade import Kind, delivery_binding_key
from delayq.topology.model import Topology
from delayq.topology.route import Router
from delayq.urls import resolve_url

__all__ = ["DelayqBroker", "dramatiq_topology"]

log = logging.getLogger("delayq.integrations.dramatiq")


def dramatiq_topology(topology: Topology) -> Topology:
    """``topology`` accepting every routing key (``external_bindings: ["#"]``): a delayed
    message's key is its queue's name, which :class:`DelayqBroker` binds to
    ``<ns>.ready`` each time Dramatiq declares the queue, before sending to it."""
    return open_topology(topology, "Dramatiq")


class DelayqBroker(RabbitmqBroker):
    """A ``RabbitmqBroker`` whose delayed messages go through delayq's tiers.

    ``url`` is RabbitMQ's (``None``: ``$DELAYQ_URL``, else localhost), for Dramatiq and
    delayq alike. ``topology`` names the namespace and the ladder
    (:func:`dramatiq_topology` makes it accept each queue's name as a key); the first
    queue declared applies it (``apply=False``: ``delayq topology apply`` did, with
    ``external_bindings: ["#"]``). ``publisher_options``: keyword arguments of the
    :class:`~delayq.sync.Publisher` (one per process, shared by its threads). Every other
    argument is ``RabbitmqBroker``'s; a message without a delay goes as Dramatiq sends it.
    """

    def __init__(
        self,
        *,
        topology: Topology,
        url: str | None = None,
        apply: bool = True,
        publisher_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if kwargs.get("parameters") is not None or any(k not in _BROKER_ARGS for k in kwargs):
            raise InvalidInput(
                "DelayqBroker takes url= (delayq's publisher connects by URL), not pika "
                f"connection parameters ({', '.join(sorted(kwargs))})"
            )
        resolved = resolve_url(url)
        super().__init__(url=resolved, **kwargs)
        self.delayq_topology = dramatiq_topology(topology)
        self._delayq_url = resolved
        self._delayq_apply = apply
        self._delayq_options = dict(publisher_options or {})
        self._delayq: Publisher | None = None
        self._delayq_lock = threading.Lock()
        self._delayq_applied = False

    def declare_actor(self, actor: Actor[Any, Any]) -> None:
        """Dramatiq's declaration of an actor, refused (:class:`~delayq.errors.InvalidInput`)
        when its ``Retries`` back-off can be longer than the topology holds: such a retry
        could not be scheduled."""
        self._check_key(actor.queue_name)
        self._check_backoff(actor)
        super().declare_actor(actor)

    def _check_key(self, queue: str) -> None:
        """Under the exact strategy the queue is bound to the cascade's delivery exchange
        by its name behind the levels' bits: a key AMQP must hold in 255 bytes."""
        topology = self.delayq_topology
        if not topology.exact_enabled:
            return
        key = delivery_binding_key(topology.exact_levels, Kind.ROUTE, queue)
        if len(key.encode()) > 255:
            room = 255 - (len(key.encode()) - len(queue.encode()))
            raise InvalidInput(
                f"queue {queue!r} is {len(queue.encode())} bytes: under the exact strategy "
                f"({topology.exact_levels} levels) a queue's name is at most {room} bytes "
                "(its binding key carries the levels' bits)"
            )

    def _check_backoff(self, actor: Actor[Any, Any]) -> None:
        retries = next((m for m in self.middleware if isinstance(m, Retries)), None)
        if retries is None or actor.options.get("max_retries", retries.max_retries) == 0:
            return
        throws = actor.options.get("throws") or ()
        expected = throws if isinstance(throws, tuple) else (throws,)
        if any(issubclass(Exception, kind) for kind in expected):
            return  # every exception is expected: never retried
        backoff = min(actor.options.get("max_backoff", retries.max_backoff), DEFAULT_MAX_BACKOFF)
        limit, what = Router(self.delayq_topology).longest()
        if backoff > limit:
            raise InvalidInput(
                f"actor {actor.actor_name!r}: Dramatiq's Retries may wait up to "
                f"{format_ms(backoff)} before a retry (max_backoff {backoff} ms), longer than "
                f"{what} of namespace {self.delayq_topology.namespace!r}: give the actor "
                f"max_backoff={limit} or less, or add a {format_ms(backoff)} tier to the ladder"
            )

    def _declare_queue(self, queue_name: str) -> Any:
        """Dramatiq's declaration of a queue, then its binding to ``<ns>.ready`` by its
        name (and to the exact cascade's delivery exchange, when the namespace has one),
        again each time Dramatiq declares it: a queue deleted and made again."""
        declared = super()._declare_queue(queue_name)  # type: ignore[no-untyped-call]
        self._apply_once()
        topology = self.delayq_topology
        bindings = [(topology.ready_exchange, queue_name)]
        if topology.exact_enabled:
            key = delivery_binding_key(topology.exact_levels, Kind.ROUTE, queue_name)
            bindings.append((topology.delivery_exchange, key))
        for exchange, key in bindings:
            try:
                self.channel.queue_bind(queue=queue_name, exchange=exchange, routing_key=key)
            except pika.exceptions.ChannelClosedByBroker as exc:
                del self.connection
                if exc.reply_code != 404:
                    raise
                raise TopologyMissing(
                    f"exchange {exchange!r} does not exist: run `delayq topology apply` with "
                    "the namespace's topology (external_bindings: ['#']), or give apply=True"
                ) from None
        return declared

    def _apply_once(self) -> None:
        with self._delayq_lock:
            if self._delayq_apply and not self._delayq_applied:
                apply_topology(self.delayq_topology, self._delayq_url)
                self._delayq_applied = True

    @property
    def delayq_publisher(self) -> Publisher:
        """The process's delayq publisher (made at the first delayed message)."""
        with self._delayq_lock:
            if self._delayq is None:
                self._delayq = Publisher(
                    self._delayq_url, self.delayq_topology, **self._delayq_options
                )
            return self._delayq

    def enqueue(self, message: Message[Any], *, delay: int | None = None) -> Message[Any]:
        """Send ``message``; with a ``delay`` (milliseconds) through the tier at or above
        it, confirmed by the broker, as a message of the actor's own queue with no
        ``eta`` (the worker runs it on arrival).

        A delay delayq refuses (:class:`~delayq.errors.InvalidDelay`: not a number of
        milliseconds at or above 0, or longer than the topology holds) raises, before
        anything is sent; but a retry's (``Retry(delay=...)``, a message's own
        ``max_backoff``) goes to Dramatiq's dead-letter queue ``<queue>.XQ`` with the
        reason in its ``delayq_reason`` option: Dramatiq acks a message whose retry could
        not be enqueued, which would lose it.
        """
        if delay is None:
            return super().enqueue(message)
        queue = q_name(message.queue_name)
        message = message.copy(queue_name=queue)  # a Message (the Retries' is a proxy)
        options = {k: v for k, v in message.options.items() if k != "eta"}
        message = replace(message, options=options)
        try:
            built = self._build(message, queue, _milliseconds(delay, message.message_id))
        except InvalidDelay as exc:
            if not options.get("retries"):
                raise
            reason = f"retry not scheduled: {exc}"
            parked = replace(message, options={**options, "delayq_reason": reason})
            park(self._delayq_url, xq_name(queue), parked.encode())
            log.error("message %s: %s; put in %s", message.message_id, reason, xq_name(queue))
            return message
        self.declare_queue(queue, ensure=True)  # and bound, before its tier can expire
        self.emit_before("enqueue", message, delay)
        self.delayq_publisher.send(built)
        self.emit_after("enqueue", message, delay)
        return message

    def _build(self, message: Message[Any], queue: str, wait: timedelta) -> OutgoingMessage:
        """delayq's message for ``message``: validated (its delay too), not sent."""
        built = self.delayq_publisher.factory.build(
            message.encode(), queue, wait, message_id=message.message_id
        )
        priority = message.options.get("broker_priority")
        if priority is not None:
            built = replace(built, properties={"priority": priority})
        return built

    def close(self) -> None:
        """Dramatiq's connections, then delayq's publisher."""
        super().close()
        with self._delayq_lock:
            publisher, self._delayq = self._delayq, None
        if publisher is not None:
            publisher.close()


def _milliseconds(delay: object, message_id: str) -> timedelta:
    """Dramatiq's delay (milliseconds, an int or a float) as a ``timedelta``; anything
    else, a negative or non-finite one, is refused, not sent at once."""
    if not isinstance(delay, (int, float)) or isinstance(delay, bool) or not delay >= 0:
        raise InvalidDelay(
            f"message {message_id}: delay {delay!r} is not a number of milliseconds at or above 0"
        )
    try:
        return timedelta(milliseconds=delay)
    except OverflowError:  # inf too
        raise DelayTooLong(
            f"message {message_id}: delay {delay!r} ms is longer than any tier can hold"
        ) from None


_BROKER_ARGS = {"confirm_delivery", "middleware", "max_priority"}
