"""``Publisher.cancel`` / ``AsyncPublisher.cancel`` on the memory broker, on virtual time.

Each scenario runs with the sync and the async publisher and consumer. See
``docs/concepts/cancel.md``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from delayq import CancelReceipt, CancelStatus, Topology
from delayq.errors import InvalidInput
from delayq.message.bulk import key_message_id
from delayq.message.cancel import SHARED_QUEUE, plan_cancels, summarise
from delayq.stores.base import Cancel
from delayq.stores.memory import InMemoryStore
from delayq.stores.sqlite import SQLiteStore
from delayq.testing import MemoryBroker

TOPOLOGY = Topology(
    namespace="shop",
    ladder=["1m", "5m", "15m"],
    destinations=[
        {"queue": "billing", "bindings": ["order.*"]},
        {"queue": "audit", "bindings": ["#"]},
    ],
)
S = CancelStatus


class Harness:
    """One publisher and consumers of one kind (sync or async) on a memory broker."""

    def __init__(self, broker: MemoryBroker, kind: str, store: Any) -> None:
        self.broker, self.kind, self.store = broker, kind, store
        self.handled: list[tuple[str, Any]] = []
        if kind == "sync":
            self.publisher: Any = broker.publisher(TOPOLOGY, store=store)
        else:
            self.publisher = broker.async_publisher(TOPOLOGY, store=store)

    async def consume(self, queue: str, **options: Any) -> None:
        def handler(body: Any) -> None:
            self.handled.append((queue, body))

        async def async_handler(body: Any) -> None:
            handler(body)

        if self.kind == "sync":
            self.broker.consumer(TOPOLOGY, queue, handler, store=self.store, **options)
        else:
            await self.broker.async_consumer(
                TOPOLOGY, queue, async_handler, store=self.store, **options
            )

    async def publish(self, body: Any, routing_key: str, delay: str, **options: Any) -> None:
        if self.kind == "sync":
            self.publisher.publish(body, routing_key, delay, **options)
        else:
            await self.publisher.publish(body, routing_key, delay, **options)

    async def cancel(self, **options: Any) -> CancelReceipt:
        if self.kind == "sync":
            return self.publisher.cancel(**options)  # type: ignore[no-any-return]
        return await self.publisher.cancel(**options)  # type: ignore[no-any-return]

    async def cancel_many(self, **options: Any) -> list[CancelReceipt]:
        if self.kind == "sync":
            return self.publisher.cancel_many(**options)  # type: ignore[no-any-return]
        return await self.publisher.cancel_many(**options)  # type: ignore[no-any-return]


KINDS = pytest.mark.parametrize("kind", ["sync", "async"])


@KINDS
def test_a_cancelled_message_is_never_handled_in_any_queue(memory_broker, kind):
    h = Harness(memory_broker, kind, InMemoryStore())

    async def scenario() -> tuple[CancelReceipt, CancelReceipt]:
        await h.consume("billing")
        await h.consume("audit")
        early = await h.cancel(message_id="early")  # before it is published
        await h.publish("early", "order.paid", "5m", message_id="early")
        await h.publish("parked", "order.paid", "5m", message_id="parked")
        await h.publish("kept", "order.paid", "5m", message_id="kept")
        await memory_broker.advance_async("1m")
        parked = await h.cancel(message_id="parked", routing_key="order.paid")
        await memory_broker.advance_async("1h")
        return early, parked

    early, parked = asyncio.run(scenario())
    assert early.queues == {"billing": S.UNKNOWN, "audit": S.UNKNOWN}
    assert early.status is S.UNKNOWN and early.cancelled and early.message_id == "early"
    assert parked.queues == {"billing": S.UNKNOWN, "audit": S.UNKNOWN} and parked.cancelled
    assert sorted(h.handled) == [("audit", "kept"), ("billing", "kept")]


@KINDS
def test_a_fanned_out_message_done_in_one_queue_is_cancelled_in_the_other(memory_broker, kind):
    h = Harness(memory_broker, kind, InMemoryStore())

    async def scenario() -> CancelReceipt:
        await h.consume("billing")
        await h.publish("x", "order.paid", "5m", message_id="m-1")
        await memory_broker.advance_async("10m")  # billing handled it; audit not started
        await h.consume("audit")
        return await h.cancel(message_id="m-1")

    receipt = asyncio.run(scenario())
    assert receipt.queues == {"billing": S.ALREADY_HANDLED, "audit": S.UNKNOWN}
    assert receipt.status is S.ALREADY_HANDLED and not receipt.cancelled
    assert h.handled == [("billing", "x")]
    asyncio.run(memory_broker.advance_async("1h"))
    assert h.handled == [("billing", "x")]  # audit's copy was delivered and cancelled


@KINDS
def test_a_cancel_while_the_handler_runs_is_told_in_progress(memory_broker, kind):
    store = InMemoryStore()
    h = Harness(memory_broker, kind, store)
    told: list[CancelReceipt] = []
    canceller = memory_broker.publisher(TOPOLOGY, store=store)

    def handler(body: Any) -> None:
        told.append(canceller.cancel(message_id="m-1", routing_key="order.paid"))
        h.handled.append(("billing", body))

    async def async_handler(body: Any) -> None:
        handler(body)

    async def scenario() -> None:
        if kind == "sync":
            memory_broker.consumer(TOPOLOGY, "billing", handler, store=store)
        else:
            await memory_broker.async_consumer(TOPOLOGY, "billing", async_handler, store=store)
        await h.publish("x", "order.paid", "1m", message_id="m-1")
        await memory_broker.advance_async("10m")

    asyncio.run(scenario())
    # audit has no consumer here: its copy is marked and waits.
    assert [r.queues for r in told] == [{"billing": S.IN_PROGRESS, "audit": S.UNKNOWN}]
    assert told[0].status is S.IN_PROGRESS and not told[0].cancelled
    assert h.handled == [("billing", "x")]  # consistent: it ran, once
    again = canceller.cancel(message_id="m-1", routing_key="order.paid")
    assert again.queues == {"billing": S.ALREADY_HANDLED, "audit": S.ALREADY_CANCELLED}
    assert again.status is S.ALREADY_HANDLED


@KINDS
def test_a_cancel_by_business_key_reaches_key_function_and_bulk_scheduled_consumers(
    memory_broker, kind
):
    h = Harness(memory_broker, kind, InMemoryStore())

    async def scenario() -> None:
        await h.consume("billing", key=lambda body: body["order"])  # keyed by the body
        await h.consume("audit")  # keyed by message id: a bulk-scheduled row's derived id
        for order in ("o-1", "o-2"):
            message_id = key_message_id(TOPOLOGY.namespace, order)
            await h.publish({"order": order}, "order.paid", "5m", message_id=message_id)
        receipt = await h.cancel(key="o-1")
        assert receipt.key == "o-1" and receipt.cancelled
        await memory_broker.advance_async("1h")

    asyncio.run(scenario())
    assert sorted(h.handled) == [("audit", {"order": "o-2"}), ("billing", {"order": "o-2"})]


@KINDS
def test_the_shared_scope_marks_one_key_for_every_queue(memory_broker, kind):
    h = Harness(memory_broker, kind, InMemoryStore())

    async def scenario() -> CancelReceipt:
        await h.consume("billing", key_scope="shared")
        receipt = await h.cancel(message_id="m-1", key_scope="shared")
        await h.publish("x", "order.paid", "1m", message_id="m-1")
        await memory_broker.advance_async("10m")
        return receipt

    receipt = asyncio.run(scenario())
    assert receipt.queues == {SHARED_QUEUE: S.UNKNOWN}
    assert h.handled == []


@KINDS
def test_cancel_many_is_one_store_round_trip(memory_broker, kind, tmp_path: Path):
    class Counting(SQLiteStore):
        batches = 0

        def cancel_batch(self, ops: Sequence[Cancel]) -> list[CancelStatus]:
            Counting.batches += 1
            return super().cancel_batch(ops)

    store = Counting(tmp_path / "keys.db")
    h = Harness(memory_broker, kind, store)
    ids = [f"m-{n}" for n in range(50)]
    receipts = asyncio.run(h.cancel_many(message_ids=ids, routing_key="order.paid"))
    assert [r.message_id for r in receipts] == ids
    assert all(r.queues == {"billing": S.UNKNOWN, "audit": S.UNKNOWN} for r in receipts)
    assert Counting.batches == 1
    assert asyncio.run(h.cancel(message_id="m-3")).status is S.ALREADY_CANCELLED
    store.close()


# --- misuse ---------------------------------------------------------------------------------------


@KINDS
@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"message_id": "a", "key": "b"}, "one of them"),
        ({}, "one of them"),
        ({"message_id": ""}, "non-empty str"),
        ({"key": 42}, "non-empty str"),
        ({"message_id": "a", "key_scope": "global"}, "key_scope must be"),
        ({"message_id": "a", "routing_key": 7}, "routing_key must be a str"),
        ({"message_id": "a", "queues": "billing"}, "queues must be a list"),
        ({"message_id": "a", "queues": [""]}, "queues must be non-empty"),
    ],
)
def test_bad_cancel_arguments_are_refused_before_the_store_is_touched(
    memory_broker, kind, options, match
):
    store = InMemoryStore()
    h = Harness(memory_broker, kind, store)
    with pytest.raises(InvalidInput, match=match):
        asyncio.run(h.cancel(**options))
    assert store.cancel("a", now_ms=0) is S.UNKNOWN  # nothing was marked before


@KINDS
def test_cancel_many_refuses_a_string_and_both_lists(memory_broker, kind):
    h = Harness(memory_broker, kind, InMemoryStore())
    with pytest.raises(InvalidInput, match="message_ids must be a list"):
        asyncio.run(h.cancel_many(message_ids="m-1"))
    with pytest.raises(InvalidInput, match="not both"):
        asyncio.run(h.cancel_many(message_ids=["a"], keys=["b"]))


@KINDS
def test_a_publisher_without_a_store_that_keeps_cancellations_cannot_cancel(memory_broker, kind):
    h = Harness(memory_broker, kind, None)
    with pytest.raises(InvalidInput, match="needs the consumers' idempotency store"):
        asyncio.run(h.cancel(message_id="m-1"))

    class Plain:
        blocking = False

        def claim(self, key: str, *, lease_ms: int, now_ms: int) -> Any:
            return None

    h = Harness(memory_broker, kind, Plain())
    with pytest.raises(InvalidInput, match="keeps no cancellations"):
        asyncio.run(h.cancel(message_id="m-1"))


def test_a_routing_key_no_destination_binds_needs_the_queues_named():
    narrow = Topology(
        namespace="shop", ladder=["1m"], destinations=[{"queue": "billing", "bindings": ["o.*"]}]
    )
    with pytest.raises(InvalidInput, match="reaches no destination"):
        plan_cancels(narrow, now_ms=0, message_ids=["m"], routing_key="x.y")
    plan = plan_cancels(narrow, now_ms=0, message_ids=["m"], routing_key="x.y", queues=["ext"])
    assert [op.key for op in plan.ops] == ["q:ext:m"]


def test_summarise_puts_a_handler_that_ran_first():
    assert summarise([S.UNKNOWN, S.ALREADY_HANDLED, S.IN_PROGRESS]) is S.ALREADY_HANDLED
    assert summarise([S.UNKNOWN, S.CANCELLED]) is S.CANCELLED
    assert summarise([S.UNKNOWN, S.UNKNOWN]) is S.UNKNOWN
    assert summarise([]) is S.UNKNOWN


def test_a_plan_with_the_wrong_number_of_answers_is_refused():
    plan = plan_cancels(TOPOLOGY, now_ms=0, message_ids=["m"])
    with pytest.raises(InvalidInput, match="1 answers for 2"):
        plan.receipts([S.UNKNOWN])
