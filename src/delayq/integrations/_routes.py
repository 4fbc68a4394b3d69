"""What every integration shares: the topology that binds a framework's queues, and a
delay read from a framework's message."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import pika

from delayq.errors import DelayTooLong, InvalidDelay, InvalidInput
from delayq.topology.destination import Destination
from delayq.topology.model import Topology

__all__ = ["delayed_key", "framework_topology", "open_topology", "park", "seconds_delay"]


def open_topology(topology: Topology, framework: str) -> Topology:
    """``topology`` accepting every routing key (``external_bindings: ["#"]``): a
    framework's delayed message is routed by a key its worker binds to ``<ns>.ready``
    when it declares its queue, which a process that only publishes does not know."""
    if not isinstance(topology, Topology):
        raise InvalidInput(
            f"{framework}: topology must be a delayq Topology (Topology(namespace=...) or "
            f"load_topology(path)), not {type(topology).__name__}"
        )
    if "#" in topology.external_bindings:
        return topology
    data = topology.model_dump()
    data["external_bindings"] = [*data["external_bindings"], "#"]
    return Topology.from_mapping(data, source=f"the topology for {framework}")


def framework_topology(topology: Topology, routes: Mapping[str, str], framework: str) -> Topology:
    """``topology`` with each of a framework's queues (``routes``: queue -> routing key)
    an ``existing: true`` destination bound by its key: delayq binds it to
    ``<ns>.ready`` and never declares it. A queue the topology already lists must be
    ``existing`` and bound by that key."""
    listed = {d.queue: d for d in topology.destinations}
    added = []
    for queue, key in routes.items():
        dest = listed.get(queue)
        if dest is None:
            added.append(Destination(queue=queue, bindings=(key,), existing=True))
        elif not dest.existing or key not in dest.bindings:
            raise InvalidInput(
                f"the topology lists {framework}'s queue {queue!r}: it must say "
                f"'existing: true' and bind {key!r} ({framework} declares the queue and "
                "routes to it by that key), or leave it out and delayq adds it"
            )
    if not added:
        return topology
    data = topology.model_dump()
    data["destinations"] = [*data["destinations"], *(d.model_dump() for d in added)]
    return Topology.from_mapping(data, source=f"the topology with {framework}'s queues")


def seconds_delay(raw: object, what: str) -> timedelta | None:
    """A framework's delay in seconds (a number, or its text: taskiq's labels are text)
    as a ``timedelta``; ``None`` when there is none. A delay that is not a finite
    number of seconds at or above zero is refused, not sent at once."""
    if raw is None:
        return None
    try:
        seconds = float(raw) if isinstance(raw, (int, float, str)) else math.nan
    except ValueError:
        seconds = math.nan
    if isinstance(raw, bool) or math.isnan(seconds) or seconds < 0:
        raise InvalidDelay(f"{what}: delay {raw!r} is not a number of seconds at or above 0")
    try:
        return timedelta(seconds=seconds)
    except OverflowError:  # inf too
        raise DelayTooLong(f"{what}: delay {raw!r} s is longer than any tier can hold") from None


def park(
    url: str, queue: str, body: bytes, *, declare: bool = False, **properties: Any
) -> None:
    """``body`` into ``queue`` (``declare``: a durable queue made if missing) through the
    default exchange, persistent and confirmed, on a connection of its own (rare: a
    framework's retry delayq cannot schedule, which the framework would drop)."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        if declare:
            channel.queue_declare(queue, durable=True)
        channel.confirm_delivery()
        channel.basic_publish(
            "", queue, body, pika.BasicProperties(delivery_mode=2, **properties), mandatory=True
        )
    finally:
        connection.close()


def delayed_key(exchange: str, key: str) -> str:
    """The routing key in ``<ns>.ready`` of a message a framework publishes to
    ``exchange`` with ``key``, and the binding key there of a queue bound to ``exchange``
    by ``key``: the exchange's name before the key, so that a message reaches the queues
    its own exchange would route it to, not those another exchange binds by the same key.
    In the name ``~`` is written ``~~`` and ``.`` ``~_`` (one word, no two names alike);
    the default exchange's is empty.

    >>> delayed_key("", "jobs"), delayed_key("orders.v2", "paid.*")
    ('.jobs', 'orders~_v2.paid.*')
    """
    return f"{exchange.replace('~', '~~').replace('.', '~_')}.{key}"
