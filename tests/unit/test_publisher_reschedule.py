"""``Publisher.reschedule`` / ``AsyncPublisher.reschedule`` on the memory broker.

Exactly one copy of a rescheduled message is handled, at its new time (later or
earlier), never at its old one. Sync and async publishers and consumers, virtual time.
See ``docs/concepts/cancel.md``.
"""

from __future__ import annotations

import asyncio
import re
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from delayq import CancelStatus, Reschedule, RescheduleReceipt, Topology
from delayq.errors import InvalidDelay, InvalidInput
from delayq.message.envelope import H_GENERATION
from delayq.stores.memory import InMemoryStore
from delayq.testing import MemoryBroker

TOPOLOGY = Topology(
    namespace="shop",
    ladder=["1m", "5m", "15m", "1h"],
    destinations=[{"queue": "reminders", "bindings": ["remind.*"]}],
)
S = CancelStatus
KINDS = pytest.mark.parametrize("kind", ["sync", "async"])


class Harness:
    def __init__(
        self,
        broker: MemoryBroker,
        kind: str,
        *,
        fail_first: bool = False,
        store: InMemoryStore | None = None,
    ) -> None:
        self.broker, self.kind = broker, kind
        broker.apply(TOPOLOGY)
        self.store = InMemoryStore() if store is None else store
        self.handled: list[tuple[int, Any]] = []
        self.failed = not fail_first
        self.consumer: Any = None
        if kind == "sync":
            self.publisher: Any = broker.publisher(TOPOLOGY, store=self.store)
        else:
            self.publisher = broker.async_publisher(TOPOLOGY, store=self.store)

    def _handle(self, body: Any) -> None:
        if not self.failed:
            self.failed = True
            raise RuntimeError("the first attempt fails")
        self.handled.append((self.broker.elapsed_ms // 60_000, body))

    async def start(self) -> None:
        if self.kind == "sync":
            self.consumer = self.broker.consumer(
                TOPOLOGY, "reminders", self._handle, store=self.store
            )
        else:

            async def handle(body: Any) -> None:
                self._handle(body)

            self.consumer = await self.broker.async_consumer(
                TOPOLOGY, "reminders", handle, store=self.store
            )

    async def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        result = getattr(self.publisher, name)(*args, **kwargs)
        return await result if self.kind == "async" else result


@KINDS
@pytest.mark.parametrize(("old", "new", "at"), [("5m", "15m", 16), ("1h", "5m", 6)])
def test_a_rescheduled_message_is_handled_once_at_its_new_time(memory_broker, kind, old, new, at):
    h = Harness(memory_broker, kind)

    async def scenario() -> RescheduleReceipt:
        await h.start()
        await h.call("publish", "call Ann", "remind.call", old, message_id="r-1")
        await memory_broker.advance_async("1m")
        moved = await h.call("reschedule", "call Ann", "remind.call", new, message_id="r-1")
        await memory_broker.advance_async("3h")
        return moved  # type: ignore[no-any-return]

    moved = asyncio.run(scenario())
    assert moved.moved and moved.marks.queues == {"reminders": S.UNKNOWN}
    assert moved.receipt is not None and moved.receipt.message_id == "r-1"
    assert h.handled == [(at, "call Ann")]  # once, at the new time, never at the old one
    assert h.consumer.stats.cancelled == 1 and h.consumer.stats.handled == 1


@KINDS
def test_only_the_last_of_several_reschedules_is_handled(memory_broker, kind):
    h = Harness(memory_broker, kind)

    async def scenario() -> None:
        await h.start()
        await h.call("publish", "v0", "remind.call", "10m", message_id="r-1")
        first = await h.call("reschedule", "v1", "remind.call", "20m", message_id="r-1")
        second = await h.call("reschedule", "v2", "remind.call", "5m", message_id="r-1")
        assert second.generation > first.generation
        await memory_broker.advance_async("2h")

    asyncio.run(scenario())
    assert h.handled == [(5, "v2")]
    assert h.consumer.stats.cancelled == 2


@KINDS
def test_a_retry_of_the_new_copy_keeps_its_generation_and_runs(memory_broker, kind):
    h = Harness(memory_broker, kind, fail_first=True)

    async def scenario() -> None:
        await h.start()
        await h.call("publish", "old", "remind.call", "1h", message_id="r-1")
        await h.call("reschedule", "new", "remind.call", "1m", message_id="r-1")
        await memory_broker.advance_async("3h")

    asyncio.run(scenario())
    assert [body for _, body in h.handled] == ["new"]
    assert h.consumer.stats.retried == 1 and h.consumer.stats.cancelled == 1


@KINDS
def test_a_reschedule_after_the_handler_ran_or_a_cancel_publishes_nothing(memory_broker, kind):
    h = Harness(memory_broker, kind)

    async def scenario() -> tuple[Any, Any]:
        await h.start()
        await h.call("publish", "x", "remind.call", "1m", message_id="done")
        await memory_broker.advance_async("5m")
        late = await h.call("reschedule", "x", "remind.call", "1m", message_id="done")
        await h.call("cancel", message_id="gone")
        gone = await h.call("reschedule", "y", "remind.call", "1m", message_id="gone")
        await memory_broker.advance_async("1h")
        return late, gone

    late, gone = asyncio.run(scenario())
    assert not late.moved and late.marks.status is S.ALREADY_HANDLED and late.receipt is None
    assert not gone.moved and gone.marks.status is S.ALREADY_CANCELLED
    assert h.handled == [(1, "x")]
    assert memory_broker.messages("reminders") == []


@KINDS
def test_an_older_generation_is_outdated_and_not_published(memory_broker, kind):
    h = Harness(memory_broker, kind)

    async def scenario() -> Any:
        await h.start()
        await h.call("reschedule", "newer", "remind.call", "5m", message_id="r", generation=9)
        return await h.call(
            "reschedule", "older", "remind.call", "1m", message_id="r", generation=8
        )

    older = asyncio.run(scenario())
    assert not older.moved and older.marks.status is S.OUTDATED
    asyncio.run(memory_broker.advance_async("1h"))
    assert h.handled == [(5, "newer")]


@KINDS
def test_the_new_copy_carries_its_generation_on_the_wire(memory_broker, kind):
    h = Harness(memory_broker, kind)
    moved = asyncio.run(h.call("reschedule", "x", "remind.call", "5m", key="order-7"))
    (parked,) = memory_broker.messages("shop.tier.5m")
    assert parked.headers[H_GENERATION] == moved.generation
    assert moved.marks.key == "order-7"


@KINDS
@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"message_id": "r", "generation": 0}, "generation"),
        ({"message_id": "r", "generation": True}, "generation"),
        ({"message_id": "r", "generation": 2**53}, "generation"),
        ({"message_id": "r", "delay": "2d"}, "longest|ladder|tier"),
        ({"message_id": "r", "delay": 5}, "unit|duration|delay"),
        ({"message_id": "r", "key": "k"}, "one of them"),
        ({}, "one of them"),
        ({"message_id": "r", "routing_key": "nothing.binds"}, "matches no binding"),
    ],
)
def test_bad_reschedules_are_refused_before_anything_is_marked(memory_broker, kind, options, match):
    h = Harness(memory_broker, kind)
    args = {"routing_key": "remind.call", "delay": "5m", **options}
    with pytest.raises(InvalidInput, match=match):
        asyncio.run(h.call("reschedule", "x", args.pop("routing_key"), args.pop("delay"), **args))
    assert h.store.claim("q:reminders:r", lease_ms=1, now_ms=0).value == "claimed"
    assert memory_broker.messages("shop.tier.5m") == []


@KINDS
def test_a_publisher_without_a_store_cannot_reschedule(memory_broker, kind):
    memory_broker.apply(TOPOLOGY)
    publisher: Any = (
        memory_broker.publisher(TOPOLOGY)
        if kind == "sync"
        else memory_broker.async_publisher(TOPOLOGY)
    )
    with pytest.raises(InvalidInput, match="needs the consumers' idempotency store"):
        result = publisher.reschedule("x", "remind.call", "5m", message_id="r")
        if kind == "async":
            asyncio.run(result)
    item = Reschedule("x", "remind.call", "5m", message_id="r")
    with pytest.raises(InvalidInput, match="needs the consumers' idempotency store"):
        result = publisher.reschedule_many([item])
        if kind == "async":
            asyncio.run(result)


@KINDS
def test_due_at_moves_a_message_to_that_moment_on_the_publishers_clock(memory_broker, kind):
    h = Harness(memory_broker, kind)
    now = datetime.fromtimestamp(memory_broker.clock_ms() / 1000, tz=timezone.utc)

    async def scenario() -> RescheduleReceipt:
        await h.start()
        await h.call("publish", "call Ann", "remind.call", "1h", message_id="r-1")
        due = (now + timedelta(minutes=15)).astimezone(timezone(timedelta(hours=-5)))
        moved = await h.call("reschedule", "call Ann", "remind.call", due_at=due, message_id="r-1")
        await memory_broker.advance_async("3h")
        return moved  # type: ignore[no-any-return]

    moved = asyncio.run(scenario())
    assert moved.moved and moved.receipt is not None
    assert moved.receipt.delay_ms == 15 * 60_000  # the time left until due_at
    assert h.handled == [(15, "call Ann")]


@KINDS
def test_due_at_in_a_batch_and_in_the_past(memory_broker, kind):
    h = Harness(memory_broker, kind)
    now = datetime.fromtimestamp(memory_broker.clock_ms() / 1000, tz=timezone.utc)

    async def scenario() -> list[RescheduleReceipt]:
        await h.start()
        for n in (1, 2):
            await h.call("publish", f"v{n}", "remind.call", "1h", message_id=f"r-{n}")
        items = [
            Reschedule("v1", "remind.call", due_at=now + timedelta(minutes=5), message_id="r-1"),
            Reschedule("v2", "remind.call", due_at=now - timedelta(days=1), message_id="r-2"),
        ]
        found = await h.call("reschedule_many", items)
        await memory_broker.advance_async("3h")
        return found  # type: ignore[no-any-return]

    found = asyncio.run(scenario())
    assert [r.receipt.delay_ms for r in found] == [5 * 60_000, 0]  # past: due now
    assert sorted(h.handled) == [(0, "v2"), (5, "v1")]


@KINDS
@pytest.mark.parametrize(
    ("delay", "due_at", "said"),
    [
        ("5m", datetime(2030, 1, 1, tzinfo=timezone.utc), "exactly one of delay= and due_at="),
        (None, None, "exactly one of delay= and due_at="),
        (None, datetime(2030, 1, 1), "has no time zone"),
        (None, "2030-01-01T00:00:00Z", "due_at must be a datetime, not str"),
    ],
)
def test_due_at_misuse_is_refused_before_anything_is_marked(
    memory_broker, kind, delay, due_at, said
):
    h = Harness(memory_broker, kind)

    async def scenario() -> None:
        await h.start()
        await h.call("publish", "x", "remind.call", "1h", message_id="r-1")
        with pytest.raises(InvalidDelay, match=re.escape(said)):
            await h.call("reschedule", "x", "remind.call", delay, due_at=due_at, message_id="r-1")
        await memory_broker.advance_async("3h")

    asyncio.run(scenario())
    assert h.handled == [(60, "x")]  # nothing marked: the old copy runs at its time
