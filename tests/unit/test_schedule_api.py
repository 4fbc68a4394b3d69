"""``Schedule`` (issue 51) on the memory broker: a reschedule and a promote by id alone
from what the index kept, a purge by label that lets none of its messages reach a
handler, and each refusal made before anything changes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from delayq import InMemoryStore, Message, Topology
from delayq.errors import InvalidDelay, InvalidInput
from delayq.schedule.api import Schedule, kept_body
from delayq.schedule.entry import State
from delayq.schedule.memory import MemorySchedule
from delayq.schedule.query import Query
from delayq.schedule.record import ScheduleIndex
from delayq.schedule.report import ScheduleReporter
from delayq.testing import MemoryBroker

TOPOLOGY = Topology(
    namespace="shop",
    ladder=["1m", "30m", "1h"],
    destinations=[{"queue": "orders", "bindings": ["order.*"]}],
)


@pytest.fixture
def shop() -> Iterator[tuple[MemoryBroker, Schedule, list[Any]]]:
    index = MemorySchedule()
    store = InMemoryStore()
    handled: list[Any] = []
    tenant = lambda m: {"tenant": m.headers.get("tenant", "none")}  # noqa: E731
    with MemoryBroker() as broker:
        broker.apply(TOPOLOGY)
        broker.consumer(TOPOLOGY, "orders", handled.append, store=store)
        publisher = broker.publisher(
            TOPOLOGY, store=store, schedule=ScheduleIndex(index, labels=tenant, keep_bodies=1024)
        )
        tenants = ["acme" if n % 2 else "globex" for n in range(10)]
        publisher.publish_many(
            [
                Message(
                    {"order": n}, "order.remind", "25m", message_id=f"o{n}", headers={"tenant": t}
                )
                for n, t in enumerate(tenants)
            ]
        )
        yield broker, Schedule(index, publisher), handled


def test_reschedule_by_id_alone_moves_the_message(shop) -> None:
    broker, schedule, handled = shop
    (receipt,) = schedule.reschedule(["o1"], "50m")
    assert receipt.moved
    entry = schedule.show("o1")
    assert entry is not None and entry.state is State.RESCHEDULED
    assert entry.tier == "1h" and receipt.receipt is not None  # was 30m
    assert entry.due_at_ms == receipt.receipt.published_at_ms + 3_600_000
    assert dict(entry.headers or {}) == {"tenant": "acme"}
    broker.advance("45m")
    assert {"order": 1} not in handled and len(handled) == 9
    broker.advance("30m")
    assert handled.count({"order": 1}) == 1


def test_the_older_copy_of_a_rescheduled_message_leaves_its_entry_waiting() -> None:
    """Rescheduled later under the same id: when the older copy comes due it is acked as
    cancelled, and the entry still says the newer one waits, until it is handled."""
    index, store, handled = MemorySchedule(), InMemoryStore(), []
    with MemoryBroker() as broker:
        broker.apply(TOPOLOGY)
        reporter = ScheduleReporter(index, interval="1h")
        broker.consumer(TOPOLOGY, "orders", handled.append, store=store, observers=[reporter])
        publisher = broker.publisher(
            TOPOLOGY, store=store, schedule=ScheduleIndex(index, keep_bodies=1024)
        )
        publisher.publish(1, "order.remind", "25m", message_id="o1")
        Schedule(index, publisher).reschedule(["o1"], "50m")
        broker.advance("31m")  # the older copy came due: cancelled
        reporter.flush()
        assert handled == [] and index.get("o1").state is State.RESCHEDULED  # type: ignore[union-attr]
        broker.advance("30m")
        reporter.close()
    assert handled == [1] and index.get("o1").state is State.HANDLED  # type: ignore[union-attr]


def test_promote_delivers_now_and_the_waiting_copy_never_reaches_the_handler(shop) -> None:
    broker, schedule, handled = shop
    schedule.promote(["o3", "o4"])
    broker.advance("1s")
    assert sorted(h["order"] for h in handled) == [3, 4]
    assert schedule.show("o3").state is State.PROMOTED  # type: ignore[union-attr]
    broker.advance("1h")
    assert sorted(h["order"] for h in handled) == list(range(10))  # 3 and 4 once each


def test_purge_by_label_lets_none_of_its_messages_through(shop) -> None:
    broker, schedule, handled = shop
    seen: list[int] = []
    report = schedule.purge(Query(labels={"tenant": "acme"}), progress=seen.append, batch=2)
    assert report.stopped == 5 and seen == [2, 4, 5]
    assert schedule.count() == 5
    assert schedule.count(Query(states={State.CANCELLED})) == 5
    broker.advance("1h")
    assert sorted(h["order"] for h in handled) == [0, 2, 4, 6, 8]


def test_changes_are_refused_before_anything_is_done(shop) -> None:
    broker, schedule, handled = shop
    with pytest.raises(InvalidInput, match="not in the schedule index"):
        schedule.promote(["o1", "nobody"])
    assert schedule.show("o1").state is State.SCHEDULED  # type: ignore[union-attr]
    with pytest.raises(InvalidInput, match="list of ids"):
        schedule.promote("o1")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="needs Schedule"):
        Schedule(schedule.store).promote(["o1"])
    with pytest.raises(InvalidInput, match="another index"):
        Schedule(MemorySchedule(), schedule.publisher).promote(["o1"])
    with pytest.raises(InvalidInput, match="did not keep its body"):
        bare = ScheduleIndex(MemorySchedule())  # keep_bodies=0: bodies not kept
        with broker.publisher(TOPOLOGY, store=InMemoryStore(), schedule=bare) as pub:
            pub.publish({"order": 99}, "order.remind", "25m", message_id="o99")
            Schedule(bare.store, pub).reschedule(["o99"], "5m")
    broker.advance("1h")
    assert len(handled) == 11


def test_kept_bodies_come_back_as_published() -> None:
    index = MemorySchedule()
    with MemoryBroker() as broker:
        broker.apply(TOPOLOGY)
        with broker.publisher(TOPOLOGY, schedule=ScheduleIndex(index, keep_bodies=100)) as pub:
            for n, body in enumerate([{"a": [1, 2.5, None]}, "text é", b"\x00raw"]):
                pub.publish(body, "order.remind", "1m", message_id=f"k{n}")
            pub.publish(b"x" * 101, "order.remind", "1m", message_id="big")
    assert [kept_body(index.get(f"k{n}")) for n in range(3)] == [  # type: ignore[arg-type]
        {"a": [1, 2.5, None]}, "text é", b"\x00raw",
    ]  # fmt: skip
    big = index.get("big")
    assert big is not None and big.body is None and not big.kept


def test_cancel_by_id_checks_every_id_first_and_expire_keeps_waiting_entries(shop) -> None:
    broker, schedule, handled = shop
    with pytest.raises(InvalidInput, match="not in the schedule index"):
        schedule.cancel(["o1", "nope"])
    assert schedule.show("o1").state is State.SCHEDULED  # nothing was done
    receipts = schedule.cancel(["o1", "o3"])
    assert [r.cancelled for r in receipts] == [True, True]
    assert schedule.show("o1").state is State.CANCELLED
    assert schedule.expire("1h") == 0  # cancelled just now
    broker.advance("1s")
    assert schedule.expire("0s") == 2
    assert schedule.show("o1") is None and schedule.show("o2").state is State.SCHEDULED
    broker.advance("30m")
    assert sorted(h["order"] for h in handled) == [0, 2, 4, 5, 6, 7, 8, 9]
    with pytest.raises(InvalidDelay):
        schedule.expire("-1h")


def test_changes_by_id_refuse_an_entry_of_another_namespace(shop) -> None:
    """Promoting through a publisher of another topology would send a copy where the
    message never was (handled twice): refused, nothing done."""
    broker, schedule, _ = shop
    other = Topology(namespace="shop2", ladder=["1m", "30m", "1h"],
                     destinations=[{"queue": "orders2", "bindings": ["order.*"]}])  # fmt: skip
    broker.apply(other)
    elsewhere = Schedule(
        schedule.store,
        broker.publisher(other, store=InMemoryStore(), schedule=schedule.publisher.schedule),
    )
    for change in (
        elsewhere.promote,
        elsewhere.cancel,
        lambda ids: elsewhere.reschedule(ids, "5m"),
    ):
        with pytest.raises(InvalidInput, match="in namespace 'shop', not 'shop2'"):
            change(["o1"])
    with pytest.raises(InvalidInput, match="namespace"):
        elsewhere.purge(Query(namespace="shop"))
    assert schedule.show("o1").state is State.SCHEDULED


def test_a_reschedule_to_now_is_a_promote_and_leaves_the_waiting_view(shop) -> None:
    broker, schedule, handled = shop
    (receipt,) = schedule.reschedule(["o2"], "0s")
    assert receipt.moved
    entry = schedule.show("o2")
    assert entry is not None and entry.state is State.PROMOTED
    assert schedule.count(Query(labels={"tenant": "globex"})) == 4  # o0, o4, o6, o8
    broker.advance("1s")
    assert handled == [{"order": 2}]


def test_an_id_waiting_in_another_namespace_is_refused_before_anything_is_sent(shop) -> None:
    """One entry per id: a message of shop2 under an id shop's entry holds would go
    unrecorded. Refused, nothing sent; the batch's other entries say unconfirmed."""
    from delayq.errors import ScheduleNotRecorded

    broker, schedule, _ = shop
    other = Topology(namespace="shop2", ladder=["1m", "30m", "1h"],
                     destinations=[{"queue": "orders2", "bindings": ["order.*"]}])  # fmt: skip
    broker.apply(other)
    publisher = broker.publisher(other, schedule=schedule.publisher.schedule)
    before = {q: broker.depth(q) for q in broker.queues()}
    with pytest.raises(ScheduleNotRecorded, match="waits in another namespace"):
        publisher.publish_many(
            [Message(1, "order.remind", "5m", message_id="fresh"),
             Message(2, "order.remind", "5m", message_id="o1")]
        )  # fmt: skip
    assert {q: broker.depth(q) for q in broker.queues()} == before
    assert schedule.show("o1").namespace == "shop"
    assert schedule.show("fresh").state is State.UNCONFIRMED
