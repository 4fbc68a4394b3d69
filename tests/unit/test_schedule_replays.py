"""A replayed copy's entry (`delayq.schedule.replays.ReplayRecord`), on the in-memory index:
what it keeps of the entry its id had, what it takes from the index, and its failures.
The broker's side is `tests/integration/test_schedule_replay.py`."""

from __future__ import annotations

from typing import Any

import pytest

from delayq import Topology
from delayq.consume.delivery import Delivery
from delayq.errors import PublishUnconfirmed, ScheduleNotRecorded, StoreError
from delayq.message.envelope import CONTENT_JSON, H_GENERATION
from delayq.ops.parked import replay_message
from delayq.schedule.entry import State
from delayq.schedule.memory import MemorySchedule
from delayq.schedule.record import ScheduleIndex
from delayq.schedule.replays import ReplayRecord

TOPOLOGY = Topology(
    namespace="shop", ladder=["1m"], destinations=[{"queue": "orders", "bindings": ["order.*"]}]
)


def _copy(message_id: str, headers: dict[str, Any] | None = None, body: bytes = b'{"n": 1}'):
    parked = Delivery(
        queue="orders.dlq",
        body=body,
        routing_key="order.paid",
        message_id=message_id,
        content_type=CONTENT_JSON,
        headers={"tenant": "kept", **(headers or {})},
    )
    return replay_message(parked, exchange="", routing_key="orders", now_ms=1_000_000)


def test_a_copy_keeps_the_labels_and_key_of_the_entry_its_id_had():
    store = MemorySchedule()
    index = ScheduleIndex(
        store, labels={"tenant": "acme"}, business_key=lambda m: "k-" + m.message_id
    )
    record = ReplayRecord(index, TOPOLOGY)
    sent: list[str] = []
    assert record.replayed(_copy("a"), "order.paid", ("orders",), lambda: sent.append("a"))
    first = store.get("a")
    assert first is not None and first.state is State.SCHEDULED
    assert (first.tier, first.due_at_ms, first.destinations) == ("", 1_000_000, ("orders",))
    assert (dict(first.labels), first.business_key) == ({"tenant": "acme"}, "k-a")
    store.move(["a"], State.DEAD_LETTERED, now_ms=1_000_001)

    other = ReplayRecord(ScheduleIndex(store, labels={"tenant": "else"}), TOPOLOGY)
    assert other.replayed(_copy("a"), "order.paid", ("orders",), lambda: sent.append("again"))
    again = store.get("a")
    assert again is not None and again.state is State.SCHEDULED
    assert (dict(again.labels), again.business_key) == ({"tenant": "acme"}, "k-a")
    assert sent == ["a", "again"]


def test_bodies_and_generation_are_kept_as_the_index_says():
    store = MemorySchedule()
    record = ReplayRecord(ScheduleIndex(store, keep_bodies=64), TOPOLOGY)
    record.replayed(_copy("g", {H_GENERATION: 3}), "order.paid", ("orders",), lambda: None)
    record.replayed(
        _copy("big", body=b'"' + b"x" * 100 + b'"'), "order.paid", ("orders",), lambda: None
    )
    kept, big = store.get("g"), store.get("big")
    assert kept is not None and kept.body == b'{"n": 1}' and kept.generation == 3
    assert kept.headers is not None and dict(kept.headers) == {"tenant": "kept"}
    assert big is not None and big.body is None


def test_a_send_that_fails_leaves_the_entry_unconfirmed_and_raises():
    store = MemorySchedule()
    record = ReplayRecord(ScheduleIndex(store), TOPOLOGY)
    copy = _copy("u")

    def fails() -> None:
        raise PublishUnconfirmed("lost")

    with pytest.raises(PublishUnconfirmed):
        record.replayed(copy, "order.paid", ("orders",), fails)
    entry = store.get("u")
    assert entry is not None and entry.state is State.UNCONFIRMED


def test_an_id_waiting_in_another_namespace_is_refused_before_the_send():
    store = MemorySchedule()
    mine = ReplayRecord(ScheduleIndex(store), TOPOLOGY)
    mine.replayed(_copy("shared"), "order.paid", ("orders",), lambda: None)
    elsewhere = Topology(
        namespace="other", ladder=["1m"], destinations=[{"queue": "x", "bindings": ["order.*"]}]
    )
    sent: list[str] = []
    with pytest.raises(ScheduleNotRecorded, match="another namespace") as caught:
        ReplayRecord(ScheduleIndex(store), elsewhere).replayed(
            _copy("shared"), "order.paid", ("x",), lambda: sent.append("no")
        )
    assert caught.value.elsewhere == ("shared",) and sent == []


def test_a_kept_body_stays_kept_and_an_unreadable_index_sends_nothing():
    store = MemorySchedule()
    ReplayRecord(ScheduleIndex(store, keep_bodies=1024), TOPOLOGY).replayed(
        _copy("k"), "order.paid", ("orders",), lambda: None
    )
    store.move(["k"], State.DEAD_LETTERED, now_ms=1_000_001)
    plain = ReplayRecord(ScheduleIndex(store), TOPOLOGY)  # keeps no bodies of its own
    plain.replayed(_copy("k"), "order.paid", ("orders",), lambda: None)
    again = store.get("k")
    assert again is not None and again.kept and again.body == b'{"n": 1}'

    class Down(MemorySchedule):
        def get(self, entry_id: str) -> Any:
            raise StoreError("index server gone")

    sent: list[str] = []
    with pytest.raises(ScheduleNotRecorded, match="could not be read: index server gone"):
        ReplayRecord(ScheduleIndex(Down()), TOPOLOGY).replayed(
            _copy("d"), "order.paid", ("orders",), lambda: sent.append("d")
        )
    assert sent == []


def test_copies_parked_again_leave_the_waiting_view():
    store = MemorySchedule()
    record = ReplayRecord(ScheduleIndex(store), TOPOLOGY)
    record.replayed(_copy("back"), "order.paid", (), lambda: None)
    assert record.parked_again(["back"]) == []
    entry = store.get("back")
    assert entry is not None and entry.state is State.DEAD_LETTERED
