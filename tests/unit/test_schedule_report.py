"""The consumers' side of the schedule index (issue 51): settled deliveries move their
entries in batches off the consumer's path; a store that fails keeps the reports for
later and never reaches the consumer; a bounded queue says what it dropped."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pytest

from delayq.consume.delivery import Action, Decision, Delivery
from delayq.errors import InvalidDelay, InvalidInput, StoreError
from delayq.observe.deliveries import Settled
from delayq.schedule.entry import Entry, State
from delayq.schedule.memory import MemorySchedule
from delayq.schedule.query import Query
from delayq.schedule.report import ScheduleReporter


def settled(message_id: str | None, action: Action) -> Settled:
    delivery = Delivery("q", b"x", "job.a", message_id, None, {})
    return Settled(delivery, Decision(action), received_at_ms=1, settled_at_ms=2, handler_ms=None)


def scheduled(store: MemorySchedule, *ids: str) -> None:
    store.add(
        [Entry(i, "shop", "job.a", due_at_ms=5, tier="1s", published_at_ms=0, size=1) for i in ids]
    )
    store.move(list(ids), State.SCHEDULED, now_ms=0)


class Flaky(MemorySchedule):
    """Fails its moves while ``down``."""

    down = False

    def move(self, ids: Sequence[str], to: State, **kw: Any) -> list[State | None]:
        if self.down:
            raise StoreError("server gone")
        return super().move(ids, to, **kw)


def test_each_outcome_moves_its_entry_at_the_next_flush() -> None:
    store = MemorySchedule()
    scheduled(store, "a", "b", "c", "d")
    reporter = ScheduleReporter(store, interval="1h")  # flushed by hand below
    try:
        for message_id, action in (
            ("a", Action.ACK),
            ("b", Action.DEAD_LETTER),
            ("c", Action.RETRY),
            ("d", Action.CANCELLED),
            (None, Action.ACK),  # no id: nothing to move
        ):
            reporter.settled(settled(message_id, action))
        assert store.count(Query()) == 4  # not before the flush
        assert reporter.flush()
        got = {i: store.get(i).state for i in "abcd"}  # type: ignore[union-attr]
        assert got == {
            "a": State.HANDLED,
            "b": State.DEAD_LETTERED,
            "c": State.DELIVERED,
            "d": State.SCHEDULED,  # a cancelled copy may be a rescheduled one's older copy
        }
        reporter.settled(settled("c", Action.ACK))  # the retry's second try
        assert reporter.flush() and store.get("c").state is State.HANDLED  # type: ignore[union-attr]
    finally:
        reporter.close()


def test_a_failing_store_keeps_the_reports_until_it_answers() -> None:
    store = Flaky()
    scheduled(store, "a", "b")
    store.down = True
    reporter = ScheduleReporter(store, interval="1h")
    try:
        reporter.settled(settled("a", Action.ACK))
        assert not reporter.flush()
        reporter.settled(settled("b", Action.ACK))
        store.down = False
        assert reporter.flush()
        assert store.count(Query(states={State.HANDLED})) == 2
    finally:
        reporter.close()


def test_a_store_down_for_long_drops_the_oldest_reports_and_counts_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = Flaky()
    store.down = True
    reporter = ScheduleReporter(store, interval="1h", max_pending=3)
    try:
        for n in range(5):
            reporter.settled(settled(f"m{n}", Action.ACK))
        assert reporter.dropped == 2
        assert "1 dropped so far" in caplog.text
    finally:
        store.down = False
        reporter.close()


def test_close_writes_what_is_queued_and_the_thread_writes_on_its_own() -> None:
    store = MemorySchedule()
    scheduled(store, "a", "b")
    reporter = ScheduleReporter(store, interval="1h")
    reporter.settled(settled("a", Action.ACK))
    reporter.close()
    assert store.get("a").state is State.HANDLED  # type: ignore[union-attr]
    quick = ScheduleReporter(store, interval="10ms")
    try:
        quick.settled(settled("b", Action.ACK))
        deadline = time.monotonic() + 10
        while store.get("b").state is not State.HANDLED:  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the reporter's thread did not write"
            time.sleep(0.01)
    finally:
        quick.close()


def test_a_retention_deletes_finished_entries_older_than_it_and_keeps_waiting_ones() -> None:
    store = MemorySchedule()
    scheduled(store, "old", "new", "waiting")
    store.move(["old"], State.HANDLED, now_ms=1_000)
    now = [1_000 + 7 * 86_400_000 + 1]
    store.move(["new"], State.HANDLED, now_ms=now[0] - 1)
    reporter = ScheduleReporter(store, interval="10ms", retention="7d", clock_ms=lambda: now[0])
    try:
        deadline = time.monotonic() + 10
        while reporter.expired == 0:  # its first round expires
            assert time.monotonic() < deadline, "the reporter did not expire"
            time.sleep(0.01)
    finally:
        reporter.close()
    assert reporter.expired == 1
    assert store.get("old") is None
    assert store.get("new") is not None and store.get("waiting") is not None


def test_bad_settings_are_refused() -> None:
    with pytest.raises(InvalidInput, match="above 0"):
        ScheduleReporter(MemorySchedule(), interval="0s")
    with pytest.raises(InvalidDelay):
        ScheduleReporter(MemorySchedule(), interval="soon")
    with pytest.raises(InvalidInput, match="max_pending"):
        ScheduleReporter(MemorySchedule(), max_pending=0)
    with pytest.raises(InvalidDelay):
        ScheduleReporter(MemorySchedule(), retention="7")


def test_a_process_that_ends_without_close_still_writes_what_is_queued(tmp_path) -> None:
    """A consumer stopped by SIGTERM ends its process without closing its observers:
    the reporter writes its queue at the normal exit."""
    import subprocess
    import sys

    from delayq.schedule.sqlite import SQLiteSchedule

    index = SQLiteSchedule(tmp_path / "i.db")
    index.add([Entry("a", "shop", "job.a", due_at_ms=5, tier="1s", published_at_ms=0, size=1)])
    index.move(["a"], State.SCHEDULED, now_ms=0)
    script = f"""
from delayq.consume.delivery import Action
from delayq.schedule.report import ScheduleReporter
from delayq.schedule.sqlite import SQLiteSchedule
from tests.unit.test_schedule_report import settled
reporter = ScheduleReporter(SQLiteSchedule({str(tmp_path / "i.db")!r}), interval="1h")
reporter.settled(settled("a", Action.ACK))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert index.get("a").state is State.HANDLED  # type: ignore[union-attr]
    index.close()
