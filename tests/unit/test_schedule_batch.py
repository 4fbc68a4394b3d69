"""A batch recorded in the schedule index step by step beside its sends
(``delayq.schedule.record.arecord_batch``): every message recorded before it is sent and
moved once its fate is known, and every failure said as one send of the whole batch
would say it. The sends here are a fake that confirms or fails what it is told; a
blocking store (called in threads) and a loop store both run."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from delayq import Message, Topology
from delayq.errors import (
    ConnectionFailed,
    PublishBatchError,
    PublishNotSent,
    PublishUnconfirmed,
    ScheduleNotRecorded,
    StoreError,
)
from delayq.message.envelope import OutgoingMessage
from delayq.message.factory import MessageFactory
from delayq.schedule.batch import arecord_batch
from delayq.schedule.entry import Entry, State
from delayq.schedule.memory import MemorySchedule
from delayq.schedule.query import Query
from delayq.schedule.record import ScheduleIndex

TOPOLOGY = Topology(
    namespace="shop", ladder=["1h"], destinations=[{"queue": "orders", "bindings": ["orders.#"]}]
)


class Store(MemorySchedule):
    """A memory index that fails its ``fail_add``-th add (1-based) or every move."""

    def __init__(self, *, blocking: bool, fail_add: int = 0, fail_moves: bool = False) -> None:
        super().__init__()
        self.blocking = blocking
        self.adds = 0
        self.fail_add = fail_add
        self.fail_moves = fail_moves

    def add(self, entries: Sequence[Entry]) -> list[bool]:
        self.adds += 1
        if self.adds == self.fail_add:
            raise StoreError("the index's disk is full")
        return super().add(entries)

    def move(self, ids: Sequence[str], to: State, **kwargs: int | None) -> list[State | None]:
        if self.fail_moves:
            raise StoreError("the index went away")
        return super().move(ids, to, **kwargs)  # type: ignore[arg-type]


def batch(n: int) -> list[OutgoingMessage]:
    factory = MessageFactory(TOPOLOGY)
    return factory.build_many([Message({"n": i}, "orders.remind", "1h") for i in range(n)])


class Sends:
    """The fake link: per step, what to do (``None`` confirms all)."""

    def __init__(self, store: Store, plan: dict[int, BaseException | set[int]]) -> None:
        self.store = store
        self.plan = plan
        self.steps: list[list[str]] = []

    async def __call__(self, part: Sequence[OutgoingMessage]) -> None:
        step = len(self.steps)
        self.steps.append([m.message_id for m in part])
        for m in part:  # recorded before it is sent
            entry = self.store.get(m.message_id)
            assert entry is not None and entry.state is State.PENDING
        await asyncio.sleep(0)
        todo = self.plan.get(step)
        if isinstance(todo, BaseException):
            raise todo
        if todo:
            failures = {i: PublishUnconfirmed("lost", part[i].message_id) for i in todo}
            receipts = [None if i in todo else m.receipt for i, m in enumerate(part)]
            raise PublishBatchError(receipts, failures)


def states(store: Store, messages: list[OutgoingMessage]) -> list[State | None]:
    return [None if (e := store.get(m.message_id)) is None else e.state for m in messages]


def run(store: Store, messages: list[OutgoingMessage], sends: Sends) -> None:
    index = ScheduleIndex(store)
    asyncio.run(arecord_batch(index, TOPOLOGY, messages, lambda: 5, sends, chunk=3))


BLOCKING = pytest.mark.parametrize("blocking", [True, False], ids=["thread", "loop"])


@BLOCKING
def test_every_step_recorded_before_it_is_sent_and_scheduled_after(blocking: bool) -> None:
    store, messages = Store(blocking=blocking), batch(8)
    sends = Sends(store, {})
    run(store, messages, sends)
    assert states(store, messages) == [State.SCHEDULED] * 8
    assert [len(s) for s in sends.steps] == ([3, 3, 2] if blocking else [8])


def test_a_first_step_the_index_refuses_is_never_sent() -> None:
    store, messages = Store(blocking=True, fail_add=1), batch(8)
    sends = Sends(store, {})
    with pytest.raises(ScheduleNotRecorded, match="nothing was published"):
        run(store, messages, sends)
    assert sends.steps == [] and store.count(Query(states=frozenset(State))) == 0


def test_a_later_step_the_index_refuses_is_never_sent_and_named() -> None:
    store, messages = Store(blocking=True, fail_add=2), batch(8)
    sends = Sends(store, {})
    with pytest.raises(PublishBatchError) as caught:
        run(store, messages, sends)
    assert len(sends.steps) == 1
    assert sorted(caught.value.failures) == [3, 4, 5, 6, 7]
    assert all(isinstance(e, PublishNotSent) for e in caught.value.failures.values())
    assert "never sent" in str(caught.value.failures[3])
    assert caught.value.receipts[:3] == [m.receipt for m in messages[:3]]
    assert states(store, messages) == [State.SCHEDULED] * 3 + [None] * 5


def test_what_a_step_did_not_confirm_is_named_at_its_place_in_the_batch() -> None:
    store, messages = Store(blocking=True), batch(8)
    run_error = None
    try:
        run(store, messages, Sends(store, {1: {0, 2}}))
    except PublishBatchError as exc:
        run_error = exc
    assert run_error is not None and sorted(run_error.failures) == [3, 5]
    expected = [State.SCHEDULED] * 8
    expected[3] = expected[5] = State.UNCONFIRMED
    assert states(store, messages) == expected


def test_a_connection_lost_for_good_in_a_later_step_fails_the_rest_unconfirmed() -> None:
    store, messages = Store(blocking=True), batch(8)
    sends = Sends(store, {1: ConnectionFailed("no broker")})
    with pytest.raises(PublishBatchError) as caught:
        run(store, messages, sends)
    failures = caught.value.failures
    assert sorted(failures) == [3, 4, 5, 6, 7]
    assert [type(failures[i]) for i in (3, 6)] == [PublishUnconfirmed, PublishNotSent]
    # the third step was recorded beside the second's send: never sent, never scheduled
    assert states(store, messages) == [State.SCHEDULED] * 3 + [State.UNCONFIRMED] * 5


def test_a_first_step_that_cannot_connect_raises_as_a_single_send_would() -> None:
    store, messages = Store(blocking=True), batch(8)
    with pytest.raises(ConnectionFailed):
        run(store, messages, Sends(store, {0: ConnectionFailed("no broker")}))
    assert states(store, messages) == [State.UNCONFIRMED] * 6 + [None] * 2


def test_a_cancelled_batch_leaves_nothing_pending_that_was_recorded() -> None:
    store, messages = Store(blocking=True), batch(8)
    with pytest.raises(asyncio.CancelledError):
        run(store, messages, Sends(store, {1: asyncio.CancelledError()}))
    assert State.PENDING not in states(store, messages)
    assert states(store, messages)[:3] == [State.SCHEDULED] * 3


@BLOCKING
def test_a_confirm_the_index_cannot_record_is_said_with_the_receipts(blocking: bool) -> None:
    store, messages = Store(blocking=blocking), batch(8)
    sends = Sends(store, {})
    store.fail_moves = True
    with pytest.raises(ScheduleNotRecorded, match="do not publish them again") as caught:
        run(store, messages, sends)
    assert caught.value.receipts == [m.receipt for m in messages]
    assert "shows 8 of them pending" in str(caught.value)
    assert sum(len(s) for s in sends.steps) == 8
    assert states(store, messages) == [State.PENDING] * 8


def test_a_later_step_failing_still_says_the_earlier_confirms_were_not_recorded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The first step is sent and confirmed, its confirm's write fails (a full disk),
    then the second step cannot be recorded: the PublishBatchError names the unsent ones
    and says the first step's entries still show pending."""

    class Full(Store):
        def move(self, ids: Sequence[str], to: State, **kwargs: int | None) -> list[State | None]:
            raise StoreError("disk full")

    store, messages = Full(blocking=True, fail_add=2), batch(8)
    with pytest.raises(PublishBatchError) as caught:
        run(store, messages, Sends(store, {}))
    assert sorted(caught.value.failures) == [3, 4, 5, 6, 7]
    assert "3 message(s) confirmed" in caplog.text and "still show pending" in caplog.text
    notes = getattr(caught.value, "__notes__", None)
    if notes is not None:
        assert "do not publish them again" in notes[0]
