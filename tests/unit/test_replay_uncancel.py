"""A DLQ replay meets cancels: skipped unless the operator says otherwise (``uncancel``).

On the memory broker, with a sync consumer and a real store: a message fails to the
DLQ, is cancelled, and is replayed; looked up only, its copy is skipped as cancelled
and the replay names it; with ``uncancel`` the mark is cleared first and the copy is
handled once. A rescheduled copy replayed from the DLQ keeps its generation (it is the
live copy, not an older one). The real-broker and CLI twin is
``tests/integration/test_cli_replay_uncancel.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from delayq import InMemoryStore, Topology
from delayq.consume.delivery import Delivery
from delayq.consume.retry import FixedBackoff
from delayq.errors import InvalidInput, StoreError
from delayq.message.envelope import H_GENERATION
from delayq.ops.replay_marks import ReplayMarks
from delayq.stores.key_scope import scoped_key
from delayq.stores.uncancel import UncancelStatus
from delayq.testing import MemoryBroker

TOPOLOGY = Topology(
    namespace="rep",
    ladder=["1m"],
    destinations=[{"queue": "orders", "bindings": ["order.*"]}],
)


class Flaky:
    """Fails while ``failing``; records what it handled."""

    def __init__(self) -> None:
        self.failing = True
        self.handled: list[Any] = []

    def __call__(self, body: Any) -> None:
        if self.failing:
            raise RuntimeError("down")
        self.handled.append(body)


def _to_the_dlq(broker: MemoryBroker, store: InMemoryStore, ids: list[str]) -> tuple[Flaky, Any]:
    handler = Flaky()
    policy = FixedBackoff(delay="1m", max_attempts=2)
    consumer = broker.consumer(TOPOLOGY, "orders", handler, store=store, policy=policy)
    publisher = broker.publisher(TOPOLOGY, store=store)
    for message_id in ids:
        publisher.publish({"id": message_id}, "order.x", "0s", message_id=message_id)
    broker.advance("5m")
    assert sorted(m.message_id for m in broker.dlq("orders")) == sorted(ids)
    handler.failing = False
    return handler, consumer


def test_a_cancelled_message_replayed_is_skipped_and_named_unless_uncancelled() -> None:
    store = InMemoryStore()
    with MemoryBroker() as broker:
        broker.apply(TOPOLOGY)
        handler, consumer = _to_the_dlq(broker, store, ["m-1", "m-2", "m-3"])
        publisher = broker.publisher(TOPOLOGY, store=store)
        receipts = publisher.cancel_many(message_ids=["m-1", "m-2"])
        assert [r.status.value for r in receipts] == ["unknown", "unknown"]

        look = ReplayMarks(store, "orders")
        assert broker.replay_dlq("orders", ["m-1", "m-3"], marks=look) == ["m-1", "m-3"]
        broker.advance("1s")
        assert look.found == {"m-1": UncancelStatus.CANCELLED, "m-3": UncancelStatus.NOT_CANCELLED}
        assert handler.handled == [{"id": "m-3"}]
        assert consumer.stats.cancelled == 1
        [line] = look.summary(["m-1", "m-3"])
        assert "1 message cancelled: their copies will be skipped as cancelled" in line
        assert "m-1" in line and "--uncancel" in line

        override = ReplayMarks(store, "orders", uncancel=True)
        assert broker.replay_dlq("orders", ["m-2"], marks=override) == ["m-2"]
        broker.advance("1s")
        assert override.found == {"m-2": UncancelStatus.UNCANCELLED}
        assert handler.handled == [{"id": "m-3"}, {"id": "m-2"}]
        assert override.summary(["m-2"]) == [
            "1 message uncancelled: their copies will be handled: m-2"
        ]
        # Handled once: replaying it again (it is done now) is a duplicate.
        assert store.uncancel_batch([scoped_key("m-2", "orders", "queue")], now_ms=0) == [
            UncancelStatus.ALREADY_HANDLED
        ]
        assert consumer.stats.cancelled == 1


def test_a_rescheduled_copy_replayed_from_the_dlq_keeps_its_generation_and_runs() -> None:
    store = InMemoryStore()
    with MemoryBroker() as broker:
        broker.apply(TOPOLOGY)
        handler = Flaky()
        policy = FixedBackoff(delay="1m", max_attempts=2)
        broker.consumer(TOPOLOGY, "orders", handler, store=store, policy=policy)
        publisher = broker.publisher(TOPOLOGY, store=store)
        publisher.publish({"v": 1}, "order.x", "1m", message_id="m-1")
        moved = publisher.reschedule({"v": 2}, "order.x", "30s", message_id="m-1")
        assert moved.moved
        broker.advance("10m")  # the new copy fails twice to the DLQ, the old one is cancelled
        [parked] = broker.dlq("orders")
        assert parked.headers[H_GENERATION] == moved.generation
        handler.failing = False
        marks = ReplayMarks(store, "orders")
        broker.replay_dlq("orders", marks=marks)
        broker.advance("1s")
        assert marks.found == {"m-1": UncancelStatus.RESCHEDULED}
        assert handler.handled == [{"v": 2}]  # before the fix: skipped as cancelled


def test_replay_marks_misuse() -> None:
    with pytest.raises(InvalidInput, match="cannot look up or remove cancel marks"):
        ReplayMarks(object(), "orders")
    with pytest.raises(InvalidInput, match="DLQ's queue name"):
        ReplayMarks(InMemoryStore(), "")
    with pytest.raises(InvalidInput, match="key_scope"):
        ReplayMarks(InMemoryStore(), "orders", key_scope="everywhere")


def test_a_business_key_and_the_shared_scope_are_keyed_as_the_consumer_keys() -> None:
    store = InMemoryStore()
    store.cancel("order-7", now_ms=0)  # a shared-scope consumer keyed by the body's order
    marks = ReplayMarks(
        store,
        "orders",
        uncancel=True,
        key_scope="shared",
        identity=lambda parked: f"order-{parked.body.decode()}",
    )
    delivery = Delivery(
        queue="orders.dlq",
        body=b"7",
        routing_key="orders",
        message_id="m-9",
        content_type=None,
        headers={},
    )
    assert marks.key_of(delivery) == "order-7"
    assert marks.before_send(delivery, now_ms=1) is UncancelStatus.UNCANCELLED


def test_a_store_failing_during_a_memory_replay_leaves_the_message_parked() -> None:
    store = InMemoryStore()
    with MemoryBroker() as broker:
        broker.apply(TOPOLOGY)
        _to_the_dlq(broker, store, ["m-1"])
        marks = ReplayMarks(store, "orders", uncancel=True)
        store.close()
        with pytest.raises(StoreError, match="is closed"):
            broker.replay_dlq("orders", marks=marks)
        assert [m.message_id for m in broker.dlq("orders")] == ["m-1"]
