"""Cancellation in the idempotency stores: one contract over every backend.

The cases that take ``store`` (or ``opener``, a second client on the same data) run
here on InMemoryStore and SQLiteStore, and again on RedisStore and PostgresStore in
``tests/integration/test_cancel_servers.py``. See ``docs/concepts/cancel.md``.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from delayq.errors import ClaimLost, InvalidInput, StoreError
from delayq.stores.base import (
    CANCELLED_GENERATION,
    Cancel,
    CancellingStore,
    CancelStatus,
    Claim,
    ClaimStatus,
    Complete,
    Release,
    TransactionalStore,
    run_cancels,
    run_ops,
)
from delayq.stores.memory import InMemoryStore
from delayq.stores.sqlite import SQLiteStore

LEASE = 1_000
CLAIMED, DONE, BUSY, CANCELLED = (
    ClaimStatus.CLAIMED,
    ClaimStatus.DONE,
    ClaimStatus.BUSY,
    ClaimStatus.CANCELLED,
)
C = CancelStatus


@pytest.fixture(params=["memory", "sqlite"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Any]]:
    """Opens clients of one store (memory: the same instance; SQLite: the same file)."""
    made: list[Any] = []
    shared = InMemoryStore()

    def open_store() -> Any:
        if request.param == "memory":
            return shared
        made.append(SQLiteStore(tmp_path / "keys.db"))
        return made[-1]

    yield open_store
    shared.close()
    for store in made:
        store.close()


@pytest.fixture
def store(opener: Callable[[], Any]) -> Any:
    return opener()


def _claim(store: Any, key: str, now_ms: int = 0, generation: int = 0) -> ClaimStatus:
    if generation:
        return store.claim(key, lease_ms=LEASE, now_ms=now_ms, generation=generation)  # type: ignore[no-any-return]
    return store.claim(key, lease_ms=LEASE, now_ms=now_ms)  # type: ignore[no-any-return]


def test_every_store_keeps_cancellations(store):
    assert isinstance(store, CancellingStore)


# --- cancel ---------------------------------------------------------------------------------------


def test_a_cancel_before_any_copy_waits_for_it_and_reports_unknown(store):
    assert store.cancel("k", now_ms=0) is C.UNKNOWN
    assert _claim(store, "k", now_ms=10) is CANCELLED
    assert _claim(store, "k", now_ms=10, generation=7) is CANCELLED  # every generation
    assert _claim(store, "other", now_ms=10) is CLAIMED


def test_cancelling_twice_reports_already_cancelled(store):
    store.cancel("k", now_ms=0)
    assert store.cancel("k", now_ms=5) is C.ALREADY_CANCELLED
    assert _claim(store, "k", now_ms=10) is CANCELLED


def test_a_cancel_loses_to_a_running_handler_and_says_so(store):
    assert _claim(store, "k", now_ms=0) is CLAIMED
    assert store.cancel("k", now_ms=500) is C.IN_PROGRESS
    store.complete("k", now_ms=600)  # the handler finishes: consistent with "in progress"
    assert _claim(store, "k", now_ms=700) is DONE
    assert store.cancel("k", now_ms=800) is C.ALREADY_HANDLED


def test_a_cancel_after_the_key_is_done_changes_nothing(store):
    _claim(store, "k")
    store.complete("k", now_ms=1)
    assert store.cancel("k", now_ms=2) is C.ALREADY_HANDLED
    assert _claim(store, "k", now_ms=3) is DONE


def test_a_cancel_after_a_claims_lease_ran_out_wins(store):
    _claim(store, "k", now_ms=0)  # its consumer died
    assert store.cancel("k", now_ms=LEASE) is C.CANCELLED  # known: the claim was there
    assert _claim(store, "k", now_ms=LEASE + 1) is CANCELLED


def test_a_cancel_during_a_retry_holds_for_the_retry(store):
    _claim(store, "k", now_ms=0)
    store.release("k")  # the handler failed: the retry waits in a tier
    assert store.cancel("k", now_ms=10).marked
    assert _claim(store, "k", now_ms=5_000) is CANCELLED


def test_a_cancelled_key_stays_cancelled_when_its_late_claim_is_given_back(store):
    _claim(store, "k", now_ms=0)
    store.cancel("k", now_ms=LEASE)  # run out: cancelled
    store.release("k")  # the late consumer gives its claim back
    assert _claim(store, "k", now_ms=LEASE + 5) is CANCELLED


# --- reschedule: generations ---------------------------------------------------------------------


def test_a_reschedule_cancels_older_copies_and_lets_its_own_run_once(store):
    assert store.cancel("k", now_ms=0, generation=5) is C.UNKNOWN
    assert _claim(store, "k", now_ms=1) is CANCELLED  # the original, generation 0
    assert _claim(store, "k", now_ms=1, generation=4) is CANCELLED
    assert _claim(store, "k", now_ms=2, generation=5) is CLAIMED
    assert _claim(store, "k", now_ms=3, generation=5) is BUSY
    store.complete("k", now_ms=4)
    assert _claim(store, "k", now_ms=5, generation=5) is DONE


def test_the_old_copy_arriving_after_an_earlier_new_one_is_cancelled(store):
    store.cancel("k", now_ms=0, generation=1)  # moved earlier: the new copy comes first
    assert _claim(store, "k", now_ms=10, generation=1) is CLAIMED
    store.complete("k", now_ms=11)
    assert _claim(store, "k", now_ms=50_000) is CANCELLED  # the old one, at its old time


def test_a_generation_going_backwards_is_outdated_and_changes_nothing(store):
    assert store.cancel("k", now_ms=0, generation=5) is C.UNKNOWN
    assert store.cancel("k", now_ms=1, generation=3) is C.OUTDATED
    assert store.cancel("k", now_ms=1, generation=5) is C.OUTDATED
    assert _claim(store, "k", now_ms=2, generation=5) is CLAIMED  # 5 still live
    store.release("k")
    assert store.cancel("k", now_ms=3, generation=7) is C.CANCELLED
    assert _claim(store, "k", now_ms=4, generation=5) is CANCELLED
    assert store.cancel("k", now_ms=5) is C.CANCELLED  # then cancelled outright
    assert store.cancel("k", now_ms=6, generation=9) is C.ALREADY_CANCELLED
    assert _claim(store, "k", now_ms=7, generation=9) is CANCELLED


def test_a_reschedule_while_the_live_copy_runs_is_refused(store):
    store.cancel("k", now_ms=0, generation=2)
    assert _claim(store, "k", now_ms=1, generation=2) is CLAIMED
    assert store.cancel("k", now_ms=2, generation=3) is C.IN_PROGRESS
    store.release("k")  # the handler failed: its retry (generation 2) stays the live copy
    assert _claim(store, "k", now_ms=3) is CANCELLED
    assert _claim(store, "k", now_ms=4, generation=2) is CLAIMED


def test_a_copy_newer_than_the_store_knows_is_claimed(store):
    assert _claim(store, "k", now_ms=0, generation=3) is CLAIMED  # its mark was pruned


# --- expiry ---------------------------------------------------------------------------------------


def test_prune_forgets_marks_older_than_the_cutoff_and_keeps_newer_ones(store):
    store.cancel("old", now_ms=100)
    store.cancel("new", now_ms=5_000)
    store.cancel("moved", now_ms=5_000, generation=2)
    _claim(store, "moved", now_ms=5_001, generation=2)
    store.release("moved")  # a released claim of a marked key: kept with its mark
    assert store.prune(older_than_ms=4_000) >= 1
    assert _claim(store, "old", now_ms=6_000) is CLAIMED
    assert _claim(store, "new", now_ms=6_000) is CANCELLED
    assert _claim(store, "moved", now_ms=6_000) is CANCELLED
    store.prune(older_than_ms=10_000)
    assert _claim(store, "new", now_ms=11_000) is CLAIMED


def test_a_completed_rescheduled_key_is_pruned_once_both_times_are_old(store):
    store.cancel("k", now_ms=0, generation=2)
    _claim(store, "k", now_ms=1, generation=2)
    store.complete("k", now_ms=5_000)
    store.prune(older_than_ms=4_000)  # the mark is old, the completion is not
    assert _claim(store, "k", now_ms=6_000, generation=2) is DONE
    store.prune(older_than_ms=6_000)
    assert _claim(store, "k", now_ms=7_000, generation=2) is CLAIMED


# --- batches --------------------------------------------------------------------------------------


def test_cancel_batch_answers_each_operation_in_order(store):
    _claim(store, "busy", now_ms=0)
    _claim(store, "done", now_ms=0)
    store.complete("done", now_ms=1)
    results = run_cancels(
        store,
        [
            Cancel("new", 10),
            Cancel("new", 11),
            Cancel("busy", 12),
            Cancel("done", 13),
            Cancel("moved", 14, 3),
            Cancel("moved", 15, 2),
        ],
    )
    assert results == [
        C.UNKNOWN,
        C.ALREADY_CANCELLED,
        C.IN_PROGRESS,
        C.ALREADY_HANDLED,
        C.UNKNOWN,
        C.OUTDATED,
    ]
    assert run_cancels(store, []) == []


def test_claims_in_a_batch_meet_cancellations(store):
    """Many claims of one lease in one batch: SQLite's grouped statements, too."""
    keys = [f"k{n}" for n in range(40)]
    run_cancels(store, [Cancel(k, 0) for k in keys[::2]])
    results = run_ops(store, [Claim(k, LEASE, 1) for k in keys])
    assert results == [CANCELLED if n % 2 == 0 else CLAIMED for n in range(len(keys))]
    run_ops(store, [Release(k) for k in keys])  # grouped releases keep the marks
    again = run_ops(store, [Claim(k, LEASE, 2) for k in keys])
    assert again == results
    run_ops(store, [Complete(k, 3) for k in keys[1::2]])
    third = run_ops(store, [Claim(k, LEASE, 4) for k in keys])
    assert third == [CANCELLED if n % 2 == 0 else DONE for n in range(len(keys))]


def test_a_batch_of_rescheduled_copies_claims_each_by_its_generation(store):
    run_cancels(store, [Cancel("a", 0, 2), Cancel("b", 0, 2)])
    results = run_ops(store, [Claim("a", LEASE, 1, 2), Claim("b", LEASE, 1), Claim("c", LEASE, 1)])
    assert results == [CLAIMED, CANCELLED, CLAIMED]


# --- atomic against claims ------------------------------------------------------------------------


def test_cancels_racing_claims_never_both_win(opener):
    """A claim and a cancel of each key from two clients at once: either the claim won
    and the cancel says in progress, or the cancel marked the key and the claim says
    cancelled (never a claimed key the cancel also reports cancelled)."""
    keys = [f"race-{n}" for n in range(200)]
    claimer, canceller = opener(), opener()
    claims: dict[str, ClaimStatus] = {}
    cancels: dict[str, CancelStatus] = {}
    start = threading.Barrier(2)

    def claim_all() -> None:
        start.wait(30)
        for key in keys:
            claims[key] = claimer.claim(key, lease_ms=60_000, now_ms=0)

    def cancel_all() -> None:
        start.wait(30)
        for key in reversed(keys):
            cancels[key] = canceller.cancel(key, now_ms=0)

    threads = [threading.Thread(target=claim_all), threading.Thread(target=cancel_all)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    allowed = {(CLAIMED, C.IN_PROGRESS), (CANCELLED, C.UNKNOWN)}
    if type(claimer).__name__ == "PostgresStore":
        # A claim that lost to a cancel committed during its statement reads the
        # statement's snapshot: "busy" (the copy is deferred, and meets the mark next time).
        allowed.add((BUSY, C.UNKNOWN))
    for key in keys:
        pair = (claims[key], cancels[key])
        assert pair in allowed, (key, pair)


# --- misuse ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "match"),
    [
        (Cancel("", 0), "non-empty str key"),
        (Cancel(b"k", 0), "non-empty str key"),  # type: ignore[arg-type]
        (Cancel(None, 0), "non-empty str key"),  # type: ignore[arg-type]
        (Cancel("k", -1), "epoch milliseconds"),
        (Cancel("k", 1.5), "epoch milliseconds"),  # type: ignore[arg-type]
        (Cancel("k", True), "epoch milliseconds"),  # type: ignore[arg-type]
        (Cancel("k", 0, 0), "generation"),
        (Cancel("k", 0, -3), "generation"),
        (Cancel("k", 0, True), "generation"),  # type: ignore[arg-type]
        (Cancel("k", 0, "2"), "generation"),  # type: ignore[arg-type]
        (Cancel("k", 0, CANCELLED_GENERATION + 1), "generation"),
    ],
)
def test_a_bad_cancel_is_refused_before_anything_is_written(store, op, match):
    with pytest.raises(InvalidInput, match=match):
        store.cancel_batch([Cancel("first", 0), op])
    with pytest.raises(InvalidInput, match=match):
        run_cancels(store, [op])
    assert _claim(store, "first") is CLAIMED  # the good one before it was not written
    assert _claim(store, "k") is CLAIMED


def test_run_cancels_refuses_a_store_without_cancellations_and_other_operations(store):
    class Plain:
        def claim(self, key: str, *, lease_ms: int, now_ms: int) -> ClaimStatus:
            return CLAIMED

    with pytest.raises(InvalidInput, match="keeps no cancellations"):
        run_cancels(Plain(), [Cancel("k", 0)])
    with pytest.raises(InvalidInput, match="takes Cancel operations"):
        run_cancels(store, [Claim("k", LEASE, 0)])  # type: ignore[list-item]


def test_a_store_without_cancellations_is_claimed_as_before():
    """A third-party store whose ``claim`` takes no generation still works for copies
    never rescheduled (generation 0 is not passed)."""

    class Plain(InMemoryStore):
        def claim(self, key: str, *, lease_ms: int, now_ms: int) -> ClaimStatus:  # type: ignore[override]
            return super().claim(key, lease_ms=lease_ms, now_ms=now_ms)

    assert run_ops(Plain(), [Claim("k", LEASE, 0)]) == [CLAIMED]


def test_a_closed_store_refuses_cancels_with_a_store_error(store):
    store.close()
    with pytest.raises(StoreError, match="is closed"):
        store.cancel("k", now_ms=0)
    with pytest.raises(StoreError, match="is closed"):
        run_cancels(store, [Cancel("k", 0)])


# --- transactions, SQLite files of an older delayq ------------------------------------------------


def test_a_cancel_after_the_lease_rolls_a_late_transaction_back(tmp_path):
    store = SQLiteStore(tmp_path / "keys.db")
    assert isinstance(store, TransactionalStore)
    assert store.claim("k", lease_ms=LEASE, now_ms=0) is CLAIMED
    assert store.cancel("k", now_ms=LEASE) is C.CANCELLED
    with pytest.raises(ClaimLost), store.transaction("k", lease_until_ms=LEASE, now_ms=LEASE):
        pass
    assert store.claim("k", lease_ms=LEASE, now_ms=LEASE + 1) is CANCELLED
    store.close()


def test_sqlite_adds_the_cancellation_columns_to_an_older_file(tmp_path):
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE delayq_idempotency (key TEXT PRIMARY KEY, done_at INTEGER, "
            "lease_until INTEGER NOT NULL)"
        )
        db.execute("INSERT INTO delayq_idempotency VALUES ('old', 5, 5)")
    db.close()
    store = SQLiteStore(path)
    assert store.claim("old", lease_ms=LEASE, now_ms=10) is DONE
    assert store.cancel("new", now_ms=10) is C.UNKNOWN
    assert store.claim("new", lease_ms=LEASE, now_ms=11) is CANCELLED
    store.close()
    again = SQLiteStore(path)  # opening it again finds the columns there
    assert again.claim("new", lease_ms=LEASE, now_ms=12) is CANCELLED
    again.close()


def test_a_failing_store_raises_store_error_with_the_cause():
    class Broken(InMemoryStore):
        def cancel_batch(self, ops: Any) -> list[CancelStatus]:
            raise OSError("disk on fire")

    with pytest.raises(StoreError, match="disk on fire") as caught:
        run_cancels(Broken(), [Cancel("k", 0)])
    assert isinstance(caught.value.__cause__, OSError)
