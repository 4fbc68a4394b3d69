"""``reschedule_many`` on a real broker with a real store (issue 15).

Two queues bind the same routing key and share one store (SQLite, Redis); sync and async
publishers and consumers. A batch moves one message earlier and one later and is refused
for one cancelled before: each moved message is handled once in each queue (its new copy),
the older copies are acked as ``cancelled``. A publisher whose broker is down raises
before it marks anything; the batch done again moves the messages. See ``docs/concepts/cancel.md``.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from delayq import CancelStatus, Reschedule
from delayq.aio import AsyncPublisher
from delayq.errors import ConnectionFailed
from delayq.sync import Publisher, apply_topology
from tests.integration import test_cancel as cancel
from tests.integration import test_key_scope as scope

make_store = scope.make_store
redis_store = scope.redis_store
redis_client = scope.redis_client
postgres_store = scope.postgres_store

ROUTING_KEY = scope.ROUTING_KEY
S = CancelStatus
KINDS = pytest.mark.parametrize("kind", ["sync", "async"])


def _reschedule_many(url: str, topology: Any, store: Any, kind: str, items: Any) -> Any:
    """One publisher of ``kind``, one ``reschedule_many`` call, the publisher closed."""
    if kind == "sync":
        with Publisher(url, topology, store=store, connect_attempts=1) as publisher:
            return publisher.reschedule_many(items)

    async def run() -> Any:
        async with AsyncPublisher(url, topology, store=store, connect_attempts=1) as publisher:
            return await publisher.reschedule_many(items)

    return asyncio.run(run())


@KINDS
@pytest.mark.parametrize("store_kind", ["sqlite", "redis"])
def test_reschedule_many_moves_each_message_once_in_every_queue(
    store_kind, kind, make_store, make_topology, rabbitmq_url
):
    topology, queues = scope.fan_out_topology(make_topology)
    apply_topology(topology, rabbitmq_url)
    store = make_store(store_kind)
    ledger = scope.Ledger()
    stop = cancel._start(rabbitmq_url, topology, queues, store, kind, ledger)
    run = uuid.uuid4().hex[:8]
    ids = {name: f"{name}-{run}" for name in ("earlier", "later", "gone")}
    try:
        with Publisher(rabbitmq_url, topology, store=store) as publisher:
            publisher.publish({"name": "old"}, ROUTING_KEY, "4s", message_id=ids["earlier"])
            publisher.publish({"name": "old"}, ROUTING_KEY, "1s", message_id=ids["later"])
            publisher.publish({"name": "old"}, ROUTING_KEY, "1s", message_id=ids["gone"])
            publisher.cancel(message_id=ids["gone"])
        moved = _reschedule_many(
            rabbitmq_url,
            topology,
            store,
            kind,
            [
                Reschedule({"name": "earlier"}, ROUTING_KEY, "1s", message_id=ids["earlier"]),
                Reschedule({"name": "later"}, ROUTING_KEY, "2s", message_id=ids["later"]),
                Reschedule({"name": "gone"}, ROUTING_KEY, "1s", message_id=ids["gone"]),
            ],
        )
        # Per queue: earlier (new, old), later (new, old), gone (old) settled.
        ledger.wait_settled(queues, 5)
    finally:
        stop()
    assert [m.moved for m in moved] == [True, True, False]
    assert moved[0].marks.queues == {q: S.UNKNOWN for q in queues}
    assert moved[2].marks.status is S.ALREADY_CANCELLED and moved[2].receipt is None
    assert ledger.runs == {f"{q}:{name}": 1 for q in queues for name in ("earlier", "later")}
    for queue in queues:
        assert sorted(ledger.outcomes[queue]) == [
            "ack",
            "ack",
            "cancelled",
            "cancelled",
            "cancelled",
        ]


@KINDS
def test_a_dead_broker_is_found_before_anything_is_marked(
    kind, make_store, make_topology, rabbitmq_url
):
    topology, queues = scope.fan_out_topology(make_topology)
    apply_topology(topology, rabbitmq_url)
    store = make_store("sqlite")
    ledger = scope.Ledger()
    stop = cancel._start(rabbitmq_url, topology, queues, store, kind, ledger)
    message_id = f"moved-{uuid.uuid4().hex[:8]}"
    items = [Reschedule({"name": "new"}, ROUTING_KEY, "1s", message_id=message_id)]
    try:
        with Publisher(rabbitmq_url, topology, store=store) as publisher:
            publisher.publish({"name": "old"}, ROUTING_KEY, "2s", message_id=message_id)
        dead = "amqp://guest:guest@127.0.0.1:1/"
        with pytest.raises(ConnectionFailed):
            _reschedule_many(dead, topology, store, kind, items)
        (again,) = _reschedule_many(rabbitmq_url, topology, store, kind, items)
        ledger.wait_settled(queues, 2)  # the old copy (cancelled) and the new one
    finally:
        stop()
    # The failed batch marked nothing (the store had no record), the second one moved it.
    assert again.moved and again.marks.queues == {q: S.UNKNOWN for q in queues}
    assert ledger.runs == {f"{q}:new": 1 for q in queues}
    for queue in queues:
        assert sorted(ledger.outcomes[queue]) == ["ack", "cancelled"]
