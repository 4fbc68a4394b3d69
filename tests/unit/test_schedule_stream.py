"""A stream (``Publisher.send_many``, what the Spark jobs publish through) recorded in the
schedule index a window at a time (``delayq.schedule.record.recorded_stream``): each
slice written pending before any of it is sent, moved once it settled; a failed pending
write sends nothing more; a send that fails midway leaves what it confirmed scheduled
and the rest unconfirmed. The sends here are a fake that confirms what it is told to; the
publisher's own path runs on ``delayq.testing.MemoryBroker``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pytest

from delayq import Message, Topology
from delayq.errors import ConnectionFailed, PublishError, ScheduleNotRecorded, StoreError
from delayq.message.envelope import OutgoingMessage
from delayq.message.factory import MessageFactory
from delayq.schedule.entry import Entry, State
from delayq.schedule.memory import MemorySchedule
from delayq.schedule.query import Query
from delayq.schedule.record import ScheduleIndex, Settle, recorded_stream
from delayq.testing import MemoryBroker

TOPOLOGY = Topology(
    namespace="shop", ladder=["1h"], destinations=[{"queue": "orders", "bindings": ["orders.#"]}]
)


class Store(MemorySchedule):
    """A memory index that logs its writes, and fails its ``fail_add``-th add (1-based)."""

    def __init__(self, log: list[tuple[str, object]], fail_add: int = 0) -> None:
        super().__init__()
        self.log, self.adds, self.fail_add = log, 0, fail_add

    def add(self, entries: Sequence[Entry]) -> list[bool]:
        self.adds += 1
        if self.adds == self.fail_add:
            raise StoreError("the index's disk is full")
        self.log.append(("add", [e.id for e in entries]))
        return super().add(entries)

    def move(self, ids: Sequence[str], to: State, **kwargs: int | None) -> list[State | None]:
        self.log.append((to.value, list(ids)))
        return super().move(ids, to, **kwargs)  # type: ignore[arg-type]


def stream(n: int) -> list[OutgoingMessage]:
    factory = MessageFactory(TOPOLOGY)
    return [factory.build({"n": i}, "orders.remind", "1h", message_id=f"m{i}") for i in range(n)]


def states(store: MemorySchedule) -> dict[str, State]:
    return {e.id: e.state for e in store.find(Query(states=set(State)), limit=1000)}


def test_each_window_is_pending_before_it_is_sent_and_moved_once_it_settled() -> None:
    log: list[tuple[str, object]] = []
    store = Store(log)

    def send(msgs: Iterable[OutgoingMessage], settle: Settle, window: int) -> None:
        for i, msg in enumerate(msgs):
            assert store.get(msg.message_id).state is State.PENDING  # type: ignore[union-attr]
            log.append(("sent", msg.message_id))
            settle(i, msg, None)

    told: list[int] = []
    recorded_stream(
        ScheduleIndex(store), TOPOLOGY, iter(stream(7)), lambda i, m, e: told.append(i), 3,
        send, lambda: 1,
    )  # fmt: skip
    assert told == list(range(7))  # the stream's own indexes, across the windows
    assert log == [
        ("add", ["m0", "m1", "m2"]), ("sent", "m0"), ("sent", "m1"), ("sent", "m2"),
        ("scheduled", ["m0", "m1", "m2"]),
        ("add", ["m3", "m4", "m5"]), ("sent", "m3"), ("sent", "m4"), ("sent", "m5"),
        ("scheduled", ["m3", "m4", "m5"]),
        ("add", ["m6"]), ("sent", "m6"), ("scheduled", ["m6"]),
    ]  # fmt: skip
    assert set(states(store).values()) == {State.SCHEDULED}


def test_a_pending_write_that_fails_sends_nothing_more_and_says_so() -> None:
    store = Store([], fail_add=2)
    sent: list[str] = []

    def send(msgs: Iterable[OutgoingMessage], settle: Settle, window: int) -> None:
        for i, msg in enumerate(msgs):
            sent.append(msg.message_id)
            settle(i, msg, None)

    with pytest.raises(ScheduleNotRecorded, match="nothing was published"):
        recorded_stream(
            ScheduleIndex(store), TOPOLOGY, iter(stream(7)), lambda *a: None, 3, send, lambda: 1
        )
    assert sent == ["m0", "m1", "m2"]
    assert states(store) == dict.fromkeys(["m0", "m1", "m2"], State.SCHEDULED)


def test_a_send_that_fails_midway_leaves_the_confirmed_scheduled_and_the_rest_unconfirmed() -> None:
    store = Store([])
    refused = PublishError("nacked")

    def send(msgs: Iterable[OutgoingMessage], settle: Settle, window: int) -> None:
        for i, msg in enumerate(msgs):
            if msg.message_id == "m4":
                raise ConnectionFailed("the broker went away")
            settle(i, msg, refused if msg.message_id == "m3" else None)

    with pytest.raises(ConnectionFailed):
        recorded_stream(
            ScheduleIndex(store), TOPOLOGY, iter(stream(9)), lambda *a: None, 3, send, lambda: 1
        )
    assert states(store) == {
        "m0": State.SCHEDULED,
        "m1": State.SCHEDULED,
        "m2": State.SCHEDULED,
        "m3": State.UNCONFIRMED,
        "m4": State.UNCONFIRMED,
        "m5": State.UNCONFIRMED,
    }  # fmt: skip  (m6 on: never pulled, never recorded)


def test_send_many_through_an_indexed_publisher_records_the_stream() -> None:
    index = MemorySchedule()
    outcomes: dict[int, PublishError | None] = {}
    with MemoryBroker() as broker:
        broker.apply(TOPOLOGY)
        with broker.publisher(TOPOLOGY, schedule=ScheduleIndex(index)) as pub:
            built = (
                pub.factory.build({"n": i}, "orders.remind", "30m", message_id=f"s{i}")
                for i in range(25)
            )
            pub.send_many(built, settle=lambda i, m, e: outcomes.setdefault(i, e), window=10)
    assert outcomes == dict.fromkeys(range(25))
    assert index.count(Query()) == 25
    assert set(states(index).values()) == {State.SCHEDULED}


def test_a_stream_of_immediate_messages_records_nothing_and_sends_all() -> None:
    index = MemorySchedule()
    with MemoryBroker() as broker:
        broker.apply(TOPOLOGY)
        with broker.publisher(TOPOLOGY, schedule=ScheduleIndex(index)) as pub:
            built = [pub.factory.build({"n": i}, "orders.remind", "0s") for i in range(5)]
            confirmed: list[int] = []
            pub.send_many(built, settle=lambda i, m, e: e is None and confirmed.append(i))
    assert confirmed == list(range(5))
    assert states(index) == {}


def test_an_id_twice_in_one_window_is_sent_twice_and_recorded_once() -> None:
    """An outside tester's stream of ids repeating within a window was refused whole
    (``entry ... is twice in one batch``), where the same stream without an index was
    sent: now each copy is sent and the id has one entry (the first), as the docs say."""
    index = MemorySchedule()
    confirmed: list[int] = []
    with MemoryBroker() as broker:
        broker.apply(TOPOLOGY)
        with broker.publisher(TOPOLOGY, schedule=ScheduleIndex(index)) as pub:
            built = [
                pub.factory.build({"n": i}, "orders.remind", "30m", message_id=f"d{i % 7}")
                for i in range(30)
            ]
            pub.send_many(built, settle=lambda i, m, e: confirmed.append(i), window=10)
            again = [Message({"n": i}, "orders.remind", "30m", message_id="e") for i in range(3)]
            pub.publish_many(again)
    assert sorted(confirmed) == list(range(30))
    assert states(index) == {i: State.SCHEDULED for i in [f"d{n}" for n in range(7)] + ["e"]}


def test_one_stream_keeps_its_pipeline_full_across_windows() -> None:
    """One ``send`` (one connection) for the whole stream: the next window is recorded
    and sent while the last one's confirms are still in flight."""
    log: list[tuple[str, object]] = []
    store = Store(log)
    calls: list[int] = []

    def send(msgs: Iterable[OutgoingMessage], settle: Settle, window: int) -> None:
        calls.append(window)
        flight: list[tuple[int, OutgoingMessage]] = []
        for i, msg in enumerate(msgs):
            log.append(("sent", msg.message_id))
            flight.append((i, msg))
            if len(flight) == window:  # the broker confirms the oldest once the window is full
                settle(*flight.pop(0), None)
        for i, msg in flight:
            settle(i, msg, None)

    recorded_stream(
        ScheduleIndex(store), TOPOLOGY, iter(stream(7)), lambda *a: None, 3, send, lambda: 1
    )
    assert calls == [3]
    assert log.index(("add", ["m3", "m4", "m5"])) < log.index(("scheduled", ["m0", "m1", "m2"]))
    assert ("sent", "m3") in log[: log.index(("scheduled", ["m0", "m1", "m2"]))]
    assert set(states(store).values()) == {State.SCHEDULED} and len(states(store)) == 7


def test_a_move_that_fails_ends_the_stream_after_its_window_and_never_in_the_send() -> None:
    class MoveFails(Store):
        def move(self, ids: Sequence[str], to: State, **kwargs: int | None) -> list[State | None]:
            if to is State.SCHEDULED and "m0" in ids:
                raise StoreError("the index's disk is full")
            return super().move(ids, to, **kwargs)

    store = MoveFails([])
    sent: list[str] = []

    def send(msgs: Iterable[OutgoingMessage], settle: Settle, window: int) -> None:
        for i, msg in enumerate(msgs):
            sent.append(msg.message_id)
            settle(i, msg, None)  # raising here would end the connection: never does

    with pytest.raises(ScheduleNotRecorded, match="published and confirmed"):
        recorded_stream(
            ScheduleIndex(store), TOPOLOGY, iter(stream(9)), lambda *a: None, 3, send, lambda: 1
        )
    assert sent == ["m0", "m1", "m2"]  # the window whose move failed, and nothing after
    assert set(states(store).values()) == {State.PENDING}
