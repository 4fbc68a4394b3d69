"""``Publisher.reschedule_many`` / ``AsyncPublisher.reschedule_many`` on the memory broker.

Many reschedules: one store round trip for the marks, the new copies in one batch, a
receipt per item in input order; refused items publish nothing; bad input anywhere marks
nothing. Sync and async publishers and consumers, virtual time. See
``docs/concepts/cancel.md``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from delayq import CancelStatus, PublishBatchError, Reschedule, RescheduleReceipt
from delayq.errors import (
    InvalidBody,
    InvalidInput,
    PublishRejected,
    StoreError,
    TopologyNotApplied,
)
from delayq.message.envelope import H_GENERATION
from delayq.stores.base import Cancel
from delayq.stores.memory import InMemoryStore
from delayq.testing import MemoryBroker
from tests.unit import test_publisher_reschedule as reschedule

TOPOLOGY = reschedule.TOPOLOGY
S = CancelStatus
KINDS = pytest.mark.parametrize("kind", ["sync", "async"])


class CountingStore(InMemoryStore):
    """Counts the store round trips for marks; ``fail`` makes them raise a StoreError."""

    def __init__(self) -> None:
        super().__init__()
        self.batches = 0
        self.fail = False

    def cancel_batch(self, ops: Sequence[Cancel]) -> list[CancelStatus]:
        self.batches += 1
        if self.fail:
            raise StoreError("the store is down")
        return super().cancel_batch(ops)


class Harness(reschedule.Harness):
    store: CountingStore

    def __init__(self, broker: MemoryBroker, kind: str) -> None:
        super().__init__(broker, kind, store=CountingStore())

    def parked(self) -> int:
        return sum(len(self.broker.messages(f"shop.tier.{t}")) for t in ("1m", "5m", "15m", "1h"))


@KINDS
def test_many_reschedules_move_each_message_once_with_a_receipt_each(memory_broker, kind):
    h = Harness(memory_broker, kind)

    async def scenario() -> list[RescheduleReceipt]:
        await h.start()
        for n, delay in enumerate(["5m", "1h", "15m", "1m"]):
            await h.call("publish", f"v0-{n}", "remind.call", delay, message_id=f"r-{n}")
        await h.call("reschedule", "newer", "remind.call", "1h", message_id="r-2", generation=9)
        await h.call("cancel", message_id="r-3")
        await memory_broker.advance_async("2m")  # r-3's copy met its cancel
        batches = h.store.batches
        moved = await h.call(
            "reschedule_many",
            [
                Reschedule("later", "remind.call", "15m", message_id="r-0"),
                Reschedule("earlier", "remind.call", "5m", message_id="r-1"),
                Reschedule("outdated", "remind.call", "1m", message_id="r-2", generation=8),
                Reschedule("cancelled", "remind.call", "1m", message_id="r-3"),
                Reschedule("by key", "remind.call", "1m", key="order-7"),
            ],
        )
        assert h.store.batches == batches + 1  # every mark in one store round trip
        await memory_broker.advance_async("3h")
        return moved  # type: ignore[no-any-return]

    moved = asyncio.run(scenario())
    assert [m.moved for m in moved] == [True, True, False, False, True]
    statuses = [S.UNKNOWN, S.UNKNOWN, S.OUTDATED, S.ALREADY_CANCELLED, S.UNKNOWN]
    assert [m.marks.status for m in moved] == statuses
    assert [m.receipt.message_id if m.receipt else None for m in moved[:4]] == [
        "r-0",
        "r-1",
        None,
        None,
    ]
    assert moved[0].generation < moved[1].generation  # one publisher clock, kept increasing
    # Each moved message once, at its new time (from minute 2), never at its old one.
    assert sorted(h.handled) == [(3, "by key"), (7, "earlier"), (17, "later"), (60, "newer")]
    assert h.consumer.stats.cancelled == 4  # r-0, r-1, r-2's old copies, r-3's at minute 1


@KINDS
def test_a_batch_after_the_handler_ran_publishes_nothing_for_that_item(memory_broker, kind):
    h = Harness(memory_broker, kind)

    async def scenario() -> list[RescheduleReceipt]:
        await h.start()
        await h.call("publish", "x", "remind.call", "1m", message_id="done")
        await memory_broker.advance_async("2m")
        moved = await h.call(
            "reschedule_many",
            [
                Reschedule("x", "remind.call", "5m", message_id="done"),
                Reschedule("y", "remind.call", "5m", message_id="fresh"),
            ],
        )
        return moved  # type: ignore[no-any-return]

    late, fresh = asyncio.run(scenario())
    assert not late.moved and late.marks.status is S.ALREADY_HANDLED and late.receipt is None
    assert fresh.moved and fresh.marks.queues == {"reminders": S.UNKNOWN}
    (parked,) = memory_broker.messages("shop.tier.5m")
    assert parked.message_id == "fresh" and parked.headers[H_GENERATION] == fresh.generation


@KINDS
def test_an_empty_batch_touches_nothing(memory_broker, kind):
    h = Harness(memory_broker, kind)
    assert asyncio.run(h.call("reschedule_many", [])) == []
    assert h.store.batches == 0


@KINDS
def test_a_failed_publish_is_told_per_item(memory_broker, kind):
    h = Harness(memory_broker, kind)
    memory_broker.fail_publishes(1, exchange="shop.tier.15m")
    items = [
        Reschedule("a", "remind.call", "5m", message_id="a"),
        Reschedule("b", "remind.call", "5m", message_id="b", generation=5),
        Reschedule("c", "remind.call", "15m", message_id="c"),
        Reschedule("d", "remind.call", "5m", message_id="d"),
    ]
    asyncio.run(h.call("reschedule", "b", "remind.call", "5m", message_id="b", generation=7))
    with pytest.raises(PublishBatchError) as caught:
        asyncio.run(h.call("reschedule_many", items))
    error = caught.value
    assert list(error.failures) == [2]  # the input index, not the index in the sent batch
    assert isinstance(error.failures[2], PublishRejected)
    assert [r.moved if r else None for r in error.receipts] == [True, False, None, True]
    assert error.receipts[1].marks.status is S.OUTDATED
    assert {m.message_id for m in memory_broker.messages("shop.tier.5m")} == {"a", "b", "d"}
    # The failed item's older copies stay cancelled: a second reschedule moves it.
    again = asyncio.run(h.call("reschedule_many", [items[2]]))
    assert again[0].moved and again[0].marks.status is S.CANCELLED


# --- misuse ---------------------------------------------------------------------------------------

GOOD = Reschedule("ok", "remind.call", "5m", message_id="ok")


@KINDS
@pytest.mark.parametrize(
    ("items", "error", "match"),
    [
        ([GOOD, Reschedule("x", "remind.call", "2d", message_id="r")], InvalidInput, "item 1"),
        ([GOOD, Reschedule("x", "remind.call", 5, message_id="r")], InvalidInput, "item 1"),
        ([GOOD, Reschedule(object(), "remind.call", "5m", message_id="r")], InvalidBody, "item 1"),
        ([GOOD, Reschedule("x", "nothing.binds", "5m", message_id="r")], InvalidInput, "item 1"),
        ([GOOD, Reschedule("x", "remind.call", "5m")], InvalidInput, "item 1: .*one of them"),
        ([Reschedule("x", "remind.call", "5m", message_id="r", key="k")], InvalidInput, "one of"),
        (
            [GOOD, Reschedule("x", "remind.call", "5m", message_id="r", generation=0)],
            InvalidInput,
            "item 1: .*generation",
        ),
        (
            [GOOD, Reschedule("again", "remind.call", "1m", message_id="ok")],
            InvalidInput,
            "item 1: message_id 'ok' is item 0 too",
        ),
        ([GOOD, ("x", "remind.call", "5m")], InvalidInput, "item 1 is tuple"),
        (GOOD, InvalidInput, "a list of delayq.Reschedule"),
        ("abc", InvalidInput, "a list of delayq.Reschedule"),
    ],
)
def test_bad_input_anywhere_is_refused_before_anything_is_marked(
    memory_broker, kind, items, error, match
):
    h = Harness(memory_broker, kind)
    with pytest.raises(error, match=match):
        asyncio.run(h.call("reschedule_many", items))
    assert h.store.batches == 0
    assert h.store.claim("q:reminders:ok", lease_ms=1, now_ms=0).value == "claimed"
    assert h.parked() == 0


@KINDS
def test_a_store_failure_publishes_nothing(memory_broker, kind):
    h = Harness(memory_broker, kind)
    h.store.fail = True
    with pytest.raises(StoreError, match="the store is down"):
        asyncio.run(h.call("reschedule_many", [GOOD]))
    assert h.parked() == 0


@KINDS
@pytest.mark.parametrize("how", ["reschedule", "reschedule_many"])
def test_a_topology_not_applied_is_refused_before_anything_is_marked(memory_broker, kind, how):
    store = CountingStore()
    publisher: Any = (
        memory_broker.publisher(TOPOLOGY, store=store)
        if kind == "sync"
        else memory_broker.async_publisher(TOPOLOGY, store=store)
    )

    async def call() -> Any:
        if how == "reschedule":
            result = publisher.reschedule("x", "remind.call", "5m", message_id="ok")
        else:
            result = publisher.reschedule_many([GOOD])
        return await result if kind == "async" else result

    with pytest.raises(TopologyNotApplied, match="topology apply"):
        asyncio.run(call())
    assert store.batches == 0
    assert store.claim("q:reminders:ok", lease_ms=1, now_ms=0).value == "claimed"
