"""Publishers keep the schedule index (issue 51) on a real broker, through both adapters:
a confirmed message is scheduled in the index, one never confirmed is marked so and not
shown as scheduled, and an index that cannot be written is told to the caller, with
what happened to the message."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from delayq import FixedBackoff, Message
from delayq.aio import AsyncPublisher
from delayq.consume.delivery import Reject
from delayq.errors import (
    ConnectionFailed,
    PublishBatchError,
    PublishError,
    PublishNotSent,
    ScheduleNotRecorded,
    StoreError,
)
from delayq.observe.publishes import Published, PublishOutcome
from delayq.schedule.batch import CHUNK
from delayq.schedule.entry import Entry, State
from delayq.schedule.query import Query
from delayq.schedule.record import ScheduleIndex
from delayq.schedule.report import ScheduleReporter
from delayq.schedule.sqlite import SQLiteSchedule
from delayq.stores.memory import InMemoryStore
from delayq.sync import Publisher, apply_topology
from delayq.topology.model import Topology

from ..amqp import depth
from .test_consumer import until


def publish(kind: str, url: str, topology: Topology, index: ScheduleIndex, **options: Any) -> Any:
    """A function that runs ``(method, *args)`` on a publisher of ``kind``, then closes it."""

    def run(method: str, *args: Any, **kwargs: Any) -> Any:
        if kind == "sync":
            with Publisher(url, topology, schedule=index, **options) as pub:
                return getattr(pub, method)(*args, **kwargs)

        async def go() -> Any:
            async with AsyncPublisher(url, topology, schedule=index, **options) as pub:
                return await getattr(pub, method)(*args, **kwargs)

        return asyncio.run(go())

    return run


@pytest.fixture(params=["sync", "async"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_a_confirmed_publish_is_scheduled_in_the_index(
    kind: str, make_topology: Callable[..., Topology], rabbitmq_url: str, tmp_path: Path
) -> None:
    topo = make_topology(["1m", "1h"])
    apply_topology(topo, rabbitmq_url)
    store = SQLiteSchedule(tmp_path / "schedule.db")
    index = ScheduleIndex(store, labels={"tenant": "acme"}, keep_bodies=100)
    run = publish(kind, rabbitmq_url, topo, index)
    many = run("publish_many", [Message({"order": n}, "job.remind", "10m") for n in range(50)])
    one = run("publish", {"order": 1}, "job.remind", "90s")  # the same tier, due after them
    run("publish", "now", "job.remind", "0s")  # immediate: not scheduled, not recorded

    assert store.count(Query()) == 51
    assert store.count(Query(states=set(State))) == 51
    entry = store.get(one.message_id)
    assert entry is not None and entry.state is State.SCHEDULED
    assert (entry.tier, entry.namespace, entry.routing_key) == ("1h", topo.namespace, "job.remind")
    assert entry.due_at_ms == one.published_at_ms + 3_600_000
    assert entry.destinations == (f"{topo.namespace}.work",)
    assert dict(entry.labels) == {"tenant": "acme"}
    assert entry.body == b'{"order":1}' and entry.content_type == "application/json"
    soon = store.find(Query(due_before_ms=entry.due_at_ms), limit=100)
    assert sorted(e.id for e in soon) == sorted(r.message_id for r in many)
    assert [(e.due_at_ms, e.id) for e in soon] == sorted((e.due_at_ms, e.id) for e in soon)
    assert depth(rabbitmq_url, topo.tier_name(topo.ladder.tiers[1])) == 51
    store.close()


class Failing:
    """A schedule store that fails ``add`` or ``move`` as told, else keeps entries."""

    blocking = False

    def __init__(self, inner: SQLiteSchedule, fail: str) -> None:
        self.inner, self.fail = inner, fail

    def add(self, entries: Sequence[Entry]) -> list[bool]:
        if self.fail == "add":
            raise StoreError("disk full")
        return self.inner.add(entries)

    def move(self, ids: Sequence[str], to: State, **kw: Any) -> list[State | None]:
        if self.fail == "move":
            raise StoreError("disk full")
        return self.inner.move(ids, to, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_an_index_that_cannot_record_the_pending_entry_stops_the_publish(
    kind: str, make_topology: Callable[..., Topology], rabbitmq_url: str, tmp_path: Path
) -> None:
    topo = make_topology(["1m"])
    apply_topology(topo, rabbitmq_url)
    index = ScheduleIndex(Failing(SQLiteSchedule(tmp_path / "s.db"), "add"))
    run = publish(kind, rabbitmq_url, topo, index)
    with pytest.raises(ScheduleNotRecorded, match="nothing was published") as raised:
        run("publish", {"order": 1}, "job.remind", "30s")
    assert raised.value.receipts == []
    with pytest.raises(ScheduleNotRecorded, match="nothing was published"):
        run("publish_many", [Message(n, "job.remind", "30s") for n in range(5)])
    assert depth(rabbitmq_url, topo.tier_name(topo.ladder.tiers[0])) == 0


def test_a_confirm_the_index_cannot_record_is_told_with_its_receipts(
    kind: str, make_topology: Callable[..., Topology], rabbitmq_url: str, tmp_path: Path
) -> None:
    topo = make_topology(["1m"])
    apply_topology(topo, rabbitmq_url)
    inner = SQLiteSchedule(tmp_path / "s.db")
    seen: list[Published] = []

    class Seen:
        def published(self, event: Published) -> None:
            seen.append(event)

    run = publish(
        kind, rabbitmq_url, topo, ScheduleIndex(Failing(inner, "move")), observers=[Seen()]
    )
    with pytest.raises(ScheduleNotRecorded, match="published and confirmed") as raised:
        run("publish", {"order": 1}, "job.remind", "30s")
    (receipt,) = raised.value.receipts
    assert depth(rabbitmq_url, topo.tier_name(topo.ladder.tiers[0])) == 1
    entry = inner.get(receipt.message_id)
    assert entry is not None and entry.state is State.PENDING  # never shown as scheduled
    assert inner.count(Query()) == 0
    assert [e.outcome for e in seen] == [PublishOutcome.CONFIRMED]


def test_a_large_async_batch_is_recorded_in_steps_beside_its_sends(
    make_topology: Callable[..., Topology], rabbitmq_url: str, tmp_path: Path
) -> None:
    """``publish_many`` of 12,000 on asyncio with a SQLite index goes out in steps of
    5,000 (the next one recorded while one is sent): every message confirmed is in the
    tier and scheduled in the index. When the index refuses the second step, the first
    was sent and confirmed, and the rest are named never sent, with no entries."""
    topo = make_topology(["1m"])
    apply_topology(topo, rabbitmq_url)
    tier = topo.tier_name(topo.ladder.tiers[0])
    total = 2 * CHUNK + 2_000
    store = SQLiteSchedule(tmp_path / "s.db")
    run = publish("async", rabbitmq_url, topo, ScheduleIndex(store))
    receipts = run("publish_many", [Message(n, "job.remind", "30s") for n in range(total)])
    assert len(receipts) == total and depth(rabbitmq_url, tier) == total
    assert store.count(Query(namespace=topo.namespace)) == total

    class SecondAddFails:
        def __init__(self) -> None:
            self.inner, self.adds = SQLiteSchedule(tmp_path / "t.db"), 0

        def add(self, entries: Sequence[Entry]) -> list[bool]:
            self.adds += 1
            if self.adds == 2:
                raise StoreError("disk full")
            return self.inner.add(entries)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    failing = SecondAddFails()
    run = publish("async", rabbitmq_url, topo, ScheduleIndex(failing))  # type: ignore[arg-type]
    with pytest.raises(PublishBatchError) as raised:
        run("publish_many", [Message(n, "job.remind", "30s") for n in range(total)])
    failures = raised.value.failures
    assert sorted(failures) == list(range(CHUNK, total))
    assert all(isinstance(e, PublishNotSent) for e in failures.values())
    assert depth(rabbitmq_url, tier) == total + CHUNK
    assert failing.inner.count(Query(states=set(State))) == CHUNK
    assert failing.inner.count(Query()) == CHUNK  # all scheduled


def test_a_publish_never_confirmed_is_marked_unconfirmed_not_scheduled(
    kind: str, make_topology: Callable[..., Topology], tmp_path: Path
) -> None:
    topo = make_topology(["1m"])
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"amqp://guest:guest@127.0.0.1:{sock.getsockname()[1]}/"
    store = SQLiteSchedule(tmp_path / "s.db")
    run = publish(kind, dead, topo, ScheduleIndex(store), connect_attempts=1)
    with pytest.raises((PublishError, ConnectionFailed)):
        run("publish", {"order": 1}, "job.remind", "30s")
    assert store.count(Query()) == 0
    assert store.count(Query(states={State.UNCONFIRMED})) == 1
    store.close()


def test_consumers_move_entries_as_their_messages_are_settled(
    make_topology: Callable[..., Topology],
    rabbitmq_url: str,
    start_consumer: Callable[..., Any],
    tmp_path: Path,
) -> None:
    topo = make_topology(["1s", "2s"])
    apply_topology(topo, rabbitmq_url)
    store = SQLiteSchedule(tmp_path / "s.db")
    tries: dict[str, int] = {}

    def handler(value: Any) -> None:
        tries[value] = tries.get(value, 0) + 1
        if value == "reject":
            raise Reject("never")
        if value == "flaky" and tries[value] == 1:
            raise ValueError("first time")

    reporter = ScheduleReporter(store, interval="100ms")
    start_consumer(
        topo,
        f"{topo.namespace}.work",
        handler,
        policy=FixedBackoff(delay="2s", max_attempts=3),
        store=InMemoryStore(),
        observers=[reporter],
    )
    run = publish("sync", rabbitmq_url, topo, ScheduleIndex(store))
    receipts = run(
        "publish_many",
        [Message(v, "job.a", "1s", message_id=v) for v in ("ok", "reject", "flaky")],
    )
    assert store.count(Query()) == 3
    want = {"ok": State.HANDLED, "reject": State.DEAD_LETTERED}

    def states() -> dict[str, State | None]:
        return {r.message_id: getattr(store.get(r.message_id), "state", None) for r in receipts}

    # the flaky one is taken (a retry waits in a tier), then handled on its second try
    assert until(lambda: states() == {**want, "flaky": State.DELIVERED}, 15), states()
    assert until(lambda: states() == {**want, "flaky": State.HANDLED}, 15), states()
    assert store.count(Query()) == 0
    reporter.close()
    assert reporter.dropped == 0
    store.close()


def test_cancel_and_reschedule_move_the_entries(
    kind: str, make_topology: Callable[..., Topology], rabbitmq_url: str, tmp_path: Path
) -> None:
    topo = make_topology(["1m", "1h"])
    apply_topology(topo, rabbitmq_url)
    store = SQLiteSchedule(tmp_path / "s.db")
    index = ScheduleIndex(store, business_key=lambda m: f"order-{json.loads(m.body)['order']}")
    run = publish(kind, rabbitmq_url, topo, index, store=InMemoryStore())
    run(
        "publish_many",
        [Message({"order": n}, "job.remind", "30s", message_id=f"m{n}") for n in range(4)],
    )
    assert store.count(Query()) == 4

    (cancel,) = run("cancel_many", message_ids=["m0"])
    assert cancel.cancelled
    moved = run("reschedule", {"order": 1}, "job.remind", "30m", message_id="m1")
    assert moved.moved
    by_key = run("reschedule", {"order": 2}, "job.remind", "30m", key="order-2")
    assert by_key.moved and by_key.receipt.message_id != "m2"
    (key_cancel,) = run("cancel_many", keys=["order-3"])
    assert key_cancel.cancelled

    def state(entry_id: str) -> State:
        got = store.get(entry_id)
        assert got is not None
        return got.state

    assert state("m0") is State.CANCELLED and state("m3") is State.CANCELLED
    assert state("m2") is State.CANCELLED  # the key's older copy, replaced by the new one
    m1 = store.get("m1")
    assert m1 is not None and m1.state is State.RESCHEDULED
    assert m1.generation == moved.generation
    assert m1.due_at_ms == moved.receipt.published_at_ms + 3_600_000
    assert state(by_key.receipt.message_id) is State.RESCHEDULED
    waiting = store.find(Query())
    assert sorted(e.id for e in waiting) == sorted(["m1", by_key.receipt.message_id])
    store.close()


def test_a_stream_through_an_indexed_publisher_is_recorded_a_window_at_a_time(
    make_topology: Callable[..., Topology], rabbitmq_url: str, tmp_path: Path
) -> None:
    """``send_many`` (the Spark jobs' path) on a real broker: 1,234 messages in windows
    of 100, every one confirmed is scheduled in the index and waits in its tier; then a
    second stream whose third window's pending write fails sends nothing of it or after
    it, and says so."""
    topo = make_topology(["1m", "1h"])
    apply_topology(topo, rabbitmq_url)
    store = SQLiteSchedule(tmp_path / "schedule.db")
    confirmed: list[int] = []
    with Publisher(rabbitmq_url, topo, schedule=ScheduleIndex(store)) as pub:
        built = (
            pub.factory.build({"n": n}, "job.remind", "10m", message_id=f"s{n}")
            for n in range(1234)
        )
        pub.send_many(built, settle=lambda i, m, e: e is None and confirmed.append(i), window=100)
    assert sorted(confirmed) == list(range(1234))
    assert store.count(Query()) == 1234
    assert store.count(Query(states={State.PENDING, State.UNCONFIRMED})) == 0
    tier = topo.tier_name(topo.ladder.tiers[1])
    assert depth(rabbitmq_url, tier) == 1234

    class ThirdAddFails(Failing):
        adds = 0

        def add(self, entries: Sequence[Entry]) -> list[bool]:
            self.adds += 1
            self.fail = "add" if self.adds == 3 else ""
            return super().add(entries)

    settled: list[int] = []
    with Publisher(rabbitmq_url, topo, schedule=ScheduleIndex(ThirdAddFails(store, ""))) as pub:
        built = (
            pub.factory.build({"n": n}, "job.remind", "10m", message_id=f"t{n}") for n in range(500)
        )
        with pytest.raises(ScheduleNotRecorded, match="nothing was published"):
            pub.send_many(built, settle=lambda i, m, e: e is None and settled.append(i), window=100)
    assert sorted(settled) == list(range(200))
    assert depth(rabbitmq_url, tier) == 1234 + 200
    assert store.count(Query()) == 1234 + 200
    store.close()


def test_an_exception_of_settle_ends_the_stream_and_sends_nothing_twice(
    make_topology: Callable[..., Topology], rabbitmq_url: str
) -> None:
    """An outside tester's ``settle`` that raised at the sixth message: the exception
    was swallowed, the connection ended, and what was unconfirmed was sent again (394
    messages in the tier for 300). Now ``send_many`` raises it, nothing more is pulled,
    and each message pulled is in the tier once."""
    topo = make_topology(["1m"])
    apply_topology(topo, rabbitmq_url)
    pulled: list[str] = []

    def stream(pub: Publisher) -> Any:
        for n in range(300):
            pulled.append(f"x{n}")
            yield pub.factory.build({"n": n}, "job.remind", "30s", message_id=f"x{n}")

    def settle(i: int, msg: Any, error: Any) -> None:
        if i == 5:
            raise ValueError("the caller's own bug")

    with Publisher(rabbitmq_url, topo) as pub:
        with pytest.raises(ValueError, match="the caller's own bug"):
            pub.send_many(stream(pub), settle=settle, window=100)
    assert len(pulled) < 300
    tier = topo.tier_name(topo.ladder.tiers[0])
    # Each sent once: the last one pulled may be held back unsent (pulled as the error came).
    until(lambda: depth(rabbitmq_url, tier) >= len(pulled) - 1, 10)
    assert len(pulled) - 1 <= depth(rabbitmq_url, tier) <= len(pulled)
