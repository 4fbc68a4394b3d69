"""Celery on RabbitMQ with its countdowns in delayq's tiers (``pip install 'delayq[celery]'``).

:func:`install` makes an app send each task with a ``countdown`` or ``eta`` (its
``retry(countdown=...)`` too) through the tier at or above its delay, confirmed, to the
task queue through ``<ns>.ready``. Celery's own way holds the task in the worker until
its time (a quorum queue's worker cannot raise its prefetch, so one held countdown keeps
every task behind it waiting), or, with quorum queues and a topic exchange, sends it
through 28 fixed ``celery_delayed_*`` exchanges and queues, where a retry's ``x-death``
headers once made RabbitMQ drop it as a cycle (celery #9867) and countdowns stuck
(#9912, #10111); the names cannot be chosen (a locked-down broker refuses them).

>>> app = Celery("shop", broker="amqp://localhost")  # doctest: +SKIP
>>> install(app, topology=Topology(namespace="shop"))  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

from celery import Celery, bootsteps
from celery.utils.time import maybe_make_aware
from kombu.compression import compress
from kombu.entity import Queue
from kombu.serialization import dumps

from delayq.errors import DelayqError, InvalidInput
from delayq.integrations._routes import delayed_key, open_topology, park
from delayq.message.envelope import H_ROUTING_KEY, HEADER_PREFIX
from delayq.sync.provision import apply_topology
from delayq.sync.publisher import Publisher
from delayq.topology.cascade import Kind, delivery_binding_key
from delayq.topology.model import Topology
from delayq.urls import resolve_url

__all__ = ["install"]

log = logging.getLogger("delayq.integrations.celery")

_RESERVED = ("x-", HEADER_PREFIX)
"""Headers a retry carries from its last delivery (RabbitMQ's ``x-death``, a quorum
queue's ``x-delivery-count``, delayq's own): never sent on, so no retry is taken for a
dead-letter cycle (celery #9867) and delayq's headers are its own."""
_CARRIED = ("correlation_id", "reply_to", "priority")


def install(
    app: Celery,
    *,
    topology: Topology,
    url: str | None = None,
    apply: bool = True,
    publisher_options: dict[str, Any] | None = None,
) -> Topology:
    """Send ``app``'s countdowns and ETAs through delayq's tiers; returns the topology
    used (``topology`` accepting every routing key: ``external_bindings: ["#"]``).

    ``url`` is delayq's (``None``: the app's ``broker_url`` when it is RabbitMQ's, else
    ``$DELAYQ_URL``, else localhost). ``apply=False``: ``delayq topology apply`` did.
    Each worker of the app binds the queues it consumes to ``<ns>.ready`` at start, and a
    delayed send binds its queue first, so a countdown sent before any worker ran waits for
    one. Call it where the app is made, before any task is sent (the worker imports the
    same module).
    """
    topology = open_topology(topology, "Celery")
    sender = _Sender(app, topology, _url(app, url), apply, dict(publisher_options or {}))
    amqp = app.amqp
    stock = amqp.send_task_message
    if isinstance(stock, _Wrapped):
        raise InvalidInput("delayq is installed on this Celery app already")
    amqp.send_task_message = _Wrapped(stock, sender)
    app.send_task = _Sending(app.send_task, app)
    app.steps["consumer"].add(_bindings_step(sender))
    return topology


def _url(app: Celery, url: str | None) -> str:
    """delayq's URL: ``url``, else the app's broker when it is an AMQP one (Celery's
    ``pyamqp://`` is ``amqp://``), else ``$DELAYQ_URL``, else localhost."""
    if url is None:
        broker = app.conf.broker_url
        first = broker[0] if isinstance(broker, (list, tuple)) and broker else broker
        if isinstance(first, str):
            scheme, _, rest = first.partition("://")
            if rest and scheme in ("amqp", "amqps", "pyamqp"):
                url = f"{'amqp' if scheme == 'pyamqp' else scheme}://{rest.split(';')[0]}"
    return resolve_url(url)


class _Wrapped:
    """Celery's ``send_task_message``, with a countdown's publish through delayq."""

    def __init__(self, stock: Callable[..., Any], sender: _Sender) -> None:
        self._stock = stock
        self._sender = sender

    def __call__(self, producer: Any, name: str, message: Any, *args: Any, **kwargs: Any) -> Any:
        headers = message[0]
        eta = _ETA.get()
        if eta:
            headers["eta"] = eta  # what Celery would have set: the worker reads it
        elif not headers.get("eta"):
            return self._stock(producer, name, message, *args, **kwargs)
        return self._stock(_DelayedProducer(producer, self._sender), name, message, *args, **kwargs)


_ETA: ContextVar[str | None] = ContextVar("delayq_celery_eta", default=None)
"""The ``eta`` header of the task being sent, set by :class:`_Sending`."""


class _Sending:
    """Celery's ``send_task`` with a countdown or ETA turned into the ``eta`` header
    here, the task sent as if it had none: Celery then routes it as any task (with
    quorum queues, not through its own ``celery_delayed_*`` exchanges, which would hide
    the exchange it is for), and :class:`_Wrapped` sends it through delayq."""

    def __init__(self, stock: Callable[..., Any], app: Celery) -> None:
        self._stock = stock
        self._app = app

    def __call__(
        self, name: str, args: Any = None, kwargs: Any = None, countdown: Any = None,
        eta: Any = None, *rest: Any, **options: Any,
    ) -> Any:  # fmt: skip
        if rest or not (countdown or eta):
            return self._stock(name, args, kwargs, countdown, eta, *rest, **options)
        token = _ETA.set(_eta_header(self._app, countdown, eta))
        try:
            return self._stock(name, args, kwargs, None, None, **options)
        finally:
            _ETA.reset(token)


def _eta_header(app: Celery, countdown: Any, eta: Any) -> str:
    """The ``eta`` header Celery writes (a countdown wins over an ETA, as in Celery)."""
    if countdown:
        when = maybe_make_aware(app.now() + timedelta(seconds=countdown), tz=app.timezone)
        return str(when.isoformat())
    return eta if isinstance(eta, str) else str(eta.isoformat())


class _Sender:
    """One delayq publisher per process (made again after a fork), shared by its threads."""

    def __init__(
        self, app: Celery, topology: Topology, url: str, apply: bool, options: dict[str, Any]
    ) -> None:
        self.app = app
        self.topology = topology
        self.url = url
        self._apply = apply
        self._options = options
        self._lock = threading.Lock()
        self._publisher: Publisher | None = None
        self._pid = 0
        self._bound: set[tuple[str, str]] = set()

    def publisher(self) -> Publisher:
        with self._lock:
            if self._publisher is None or self._pid != os.getpid():
                if self._apply and self._pid == 0:
                    apply_topology(self.topology, self.url)
                publisher = Publisher(self.url, self.topology, **self._options)
                publisher.connect()  # TopologyNotApplied before anything is bound
                self._publisher, self._pid = publisher, os.getpid()
            return self._publisher

    def key(self, exchange: str, routing_key: str, origin: object) -> str:
        """The key in ``<ns>.ready`` of a task Celery sends to ``exchange`` with
        ``routing_key``. A retry goes where its delivery came from: an exchange of the
        namespace (``<ns>.ready``, a cascade level), whose key delayq stamped on it
        (``origin``: its ``delayq-routing-key`` header)."""
        if exchange.startswith(f"{self.topology.namespace}.") and isinstance(origin, str):
            return origin
        return delayed_key(exchange, routing_key)

    def bind(self, channel: Any, queue: str, key: str) -> None:
        """``queue`` bound to ``<ns>.ready`` by ``key`` (and to the exact cascade's delivery
        exchange, when the namespace has one), once per process."""
        if (queue, key) in self._bound:
            return
        topology = self.topology
        channel.queue_bind(queue=queue, exchange=topology.ready_exchange, routing_key=key)
        if topology.exact_enabled:
            cascade = delivery_binding_key(topology.exact_levels, Kind.ROUTE, key)
            channel.queue_bind(
                queue=queue, exchange=topology.delivery_exchange, routing_key=cascade
            )
        self._bound.add((queue, key))


def queue_keys(queue: Queue) -> list[str]:
    """The keys in ``<ns>.ready`` a delayed task for ``queue`` can carry
    (:func:`~delayq.integrations._routes.delayed_key`): through the default exchange by
    its name (Celery's route to a queue on a direct exchange), and through each exchange
    it is bound to by that binding's key (every key, on a fanout)."""
    keys = [delayed_key("", str(queue.name))]
    bindings = [
        (queue.exchange, queue.routing_key),
        *((b.exchange, b.routing_key) for b in queue.bindings or ()),
    ]
    for exchange, key in bindings:
        name = getattr(exchange, "name", exchange) or ""
        if name:
            by = "#" if getattr(exchange, "type", "") == "fanout" else (key or str(queue.name))
            keys.append(delayed_key(str(name), str(by)))
    return keys


class _DelayedProducer:
    """Stands in for kombu's producer in Celery's ``send_task_message``: its ``publish``
    serializes as kombu does, then sends through delayq instead of the broker's
    exchange. Everything else is the real producer's."""

    def __init__(self, producer: Any, sender: _Sender) -> None:
        self._producer = producer
        self._sender = sender

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)

    def publish(
        self, body: Any, *, exchange: Any = None, routing_key: str | None = None,
        serializer: str | None = None,
        compression: str | None = None, headers: dict[str, Any] | None = None,
        declare: list[Any] | None = None, **properties: Any,
    ) -> None:  # fmt: skip
        publisher = self._sender.publisher()  # the topology applied first
        origin = (headers or {}).get(H_ROUTING_KEY)
        headers = {k: v for k, v in (headers or {}).items() if not k.startswith(_RESERVED)}
        exchange_name = str(getattr(exchange, "name", exchange) or "")
        if exchange_name.startswith("celery_delayed_"):
            raise InvalidInput(
                "a countdown reached Celery's own delayed-delivery exchanges: call "
                "delayq.integrations.celery.install(app, ...) before any task is sent"
            )
        key = self._sender.key(exchange_name, routing_key or "", origin)
        for entity in declare or ():
            self._producer.maybe_declare(entity)
            if isinstance(entity, Queue):
                for binding in queue_keys(entity):
                    self._sender.bind(self._producer.channel, str(entity.name), binding)
        content_type, content_encoding, data = dumps(  # type: ignore[no-untyped-call]
            body, serializer=serializer or self._producer.serializer
        )
        if compression:
            data, headers["compression"] = compress(data, compression)  # type: ignore[no-untyped-call]
        carried = {k: properties[k] for k in _CARRIED if properties.get(k) not in (None, "")}
        carried.update(content_type=content_type, content_encoding=content_encoding)
        task_id = headers.get("id") or properties.get("correlation_id")
        try:
            delay = _delay(str(headers["eta"]), self._sender.app)
            built = publisher.factory.build(
                data, key, delay, message_id=str(task_id) if task_id else None, headers=headers
            )
            _check_expires(headers, built.receipt.published_at_ms, delay, built.receipt.tier_ms)
            publisher.send(replace(built, properties=carried))
        except DelayqError as exc:
            if not headers.get("retries"):
                raise  # the caller's own countdown: the caller hears it
            # Celery rejects a retry whose publish failed, without requeue: lost.
            parked = f"{self._sender.topology.namespace}.celery-parked"
            reason = f"retry not scheduled: {type(exc).__name__}: {exc}"
            about = {"x-delayq-reason": reason, "x-delayq-exchange": exchange_name,
                     "x-delayq-routing-key": routing_key or ""}  # fmt: skip
            try:
                park(self._sender.url, parked, data, declare=True,
                     headers={**headers, **about}, **carried)  # fmt: skip
            except Exception as parking:
                raise exc from parking
            log.error("task %s: %s; put in %s", task_id, reason, parked)


def _check_expires(
    headers: dict[str, Any], published_ms: int, delay: timedelta, wait_ms: int
) -> None:
    """Refuse a countdown that Celery would run but that arrives, after its tier's wait
    (longer than the countdown), past its ``expires``: the worker would discard it."""
    expires = headers.get("expires")
    if not isinstance(expires, str):
        return
    when = datetime.fromisoformat(expires)
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    expires_ms = when.timestamp() * 1000
    due_ms = published_ms + delay.total_seconds() * 1000
    if due_ms < expires_ms < published_ms + wait_ms:
        raise InvalidInput(
            f"task {headers.get('id')}: its countdown of {delay.total_seconds():g} s waits "
            f"{wait_ms / 1000:g} s in its tier, past its expires ({expires}): the worker "
            "would discard it. Give it a later expires, or the ladder a tier that fits"
        )


def _delay(eta: str, app: Celery) -> timedelta:
    """The wait until ``eta`` (Celery's ISO 8601 header), at least none."""
    due = datetime.fromisoformat(eta)
    if due.tzinfo is None:
        due = due.replace(tzinfo=timezone.utc)
    now: datetime = app.now()
    if now.tzinfo is None:
        now = now.replace(tzinfo=timezone.utc)
    return max(due - now, timedelta(0))


def _bindings_step(sender: _Sender) -> type[bootsteps.StartStopStep]:
    """A worker's consumer step: the queues it consumes bound to ``<ns>.ready``."""

    class DelayqBindings(bootsteps.StartStopStep):  # type: ignore[misc]
        requires = ("celery.worker.consumer.tasks:Tasks",)

        def start(self, c: Any) -> None:
            sender.publisher()  # applied (or TopologyNotApplied) before anything is bound
            with c.app.connection_for_write() as connection:
                channel = connection.default_channel
                for queue in c.task_consumer.queues:
                    queue(channel).declare()
                    for key in queue_keys(queue):
                        sender.bind(channel, str(queue.name), key)
            log.info("delayq: bound %d queue(s) to %s", len(c.task_consumer.queues),
                     sender.topology.ready_exchange)  # fmt: skip

    return DelayqBindings
