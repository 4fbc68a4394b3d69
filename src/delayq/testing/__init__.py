"""Test your handlers' delays, retries and dead letters in milliseconds.

:class:`MemoryBroker` runs delayq's topology (tiers or exact levels, the ready
exchange, unrouted parking, destination queues, DLQs, queue-addressed retries)
in memory, with RabbitMQ's routing, TTL and dead-letter semantics and a virtual
clock. Its ``url`` (``memory://NAME``) works wherever a broker URL does::

    broker = MemoryBroker()
    consumer = Consumer(broker.url, topology, "emails", send_email, policy=policy)
    consumer.start()
    Publisher(broker.url, topology).publish({"to": "a@b.c"}, "email.welcome", "15m")
    broker.advance("15m")        # the handler has run, on virtual time
    assert broker.dlq("emails") == []

The pytest plugin of delayq provides a fresh one per test: the ``memory_broker``
fixture.
"""

from __future__ import annotations

from delayq.testing.broker import Dropped, MemoryBroker, NoProgress, broker_for
from delayq.testing.clock import VirtualClock
from delayq.testing.model import StoredMessage
from delayq.topology.topic import topic_matches

__all__ = [
    "Dropped",
    "MemoryBroker",
    "NoProgress",
    "StoredMessage",
    "VirtualClock",
    "broker_for",
    "topic_matches",
]
