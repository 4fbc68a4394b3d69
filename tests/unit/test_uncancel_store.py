"""Undoing a cancel in the idempotency stores (``uncancel_batch``): one contract over
every backend.

The cases that take ``store`` (or ``opener``) run here on InMemoryStore and SQLiteStore
(the fixtures of ``test_cancel_store.py``), and again on RedisStore and PostgresStore
in ``tests/integration/test_uncancel_servers.py``. Only a cancel's mark is removed; a
done key, a live claim and a reschedule's mark are left, each answered for. See
``docs/concepts/cancel.md`` (Retries in flight and DLQ replay).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from delayq.errors import InvalidInput, StoreError
from delayq.stores.base import CANCELLED_GENERATION, Cancel, ClaimStatus
from delayq.stores.uncancel import UncancellingStore, UncancelStatus, run_uncancels
from tests.unit import test_cancel_store as contract
from tests.unit.test_cancel_store import LEASE, _claim

# The store fixtures of the cancel contract: memory and SQLite.
opener = contract.opener
store = contract.store

U = UncancelStatus


def test_every_store_can_uncancel(store):
    assert isinstance(store, UncancellingStore)


def test_an_uncancelled_key_is_claimed_and_handled_as_if_never_cancelled(store):
    store.cancel("k", now_ms=0)
    assert _claim(store, "k", now_ms=1) is ClaimStatus.CANCELLED
    assert store.uncancel_batch(["k"], now_ms=2) == [U.UNCANCELLED]
    assert _claim(store, "k", now_ms=3) is ClaimStatus.CLAIMED
    store.complete("k", now_ms=4)
    assert _claim(store, "k", now_ms=5) is ClaimStatus.DONE
    assert store.uncancel_batch(["k"], now_ms=6) == [U.ALREADY_HANDLED]


def test_an_uncancel_answers_each_key_in_order_and_touches_only_marks(store):
    store.cancel("cancelled", now_ms=0)
    _claim(store, "running", now_ms=0)
    _claim(store, "done", now_ms=0)
    store.complete("done", now_ms=1)
    _claim(store, "given-back", now_ms=0)
    store.release("given-back")
    store.cancel("moved", now_ms=0, generation=7)  # a reschedule's mark
    keys = ["running", "cancelled", "unknown", "done", "moved", "given-back"]
    assert store.uncancel_batch(keys, now_ms=10) == [
        U.IN_PROGRESS,
        U.UNCANCELLED,
        U.NOT_CANCELLED,
        U.ALREADY_HANDLED,
        U.RESCHEDULED,
        U.NOT_CANCELLED,
    ]
    # Nothing but the cancel's mark changed:
    assert _claim(store, "running", now_ms=11) is ClaimStatus.BUSY
    assert _claim(store, "done", now_ms=11) is ClaimStatus.DONE
    assert _claim(store, "moved", now_ms=11) is ClaimStatus.CANCELLED  # older copy: still
    assert _claim(store, "moved", now_ms=11, generation=7) is ClaimStatus.CLAIMED
    assert _claim(store, "cancelled", now_ms=11) is ClaimStatus.CLAIMED


def test_a_done_key_with_a_late_cancel_mark_stays_done(store):
    """A handler finishing past its lease after a cancel: the key is done and marked;
    an uncancel must not reopen it (its handler ran)."""
    _claim(store, "late", now_ms=0)
    assert store.cancel("late", now_ms=LEASE + 1).value == "cancelled"
    store.complete("late", now_ms=LEASE + 2)
    assert store.uncancel_batch(["late"], now_ms=LEASE + 3) == [U.ALREADY_HANDLED]
    assert _claim(store, "late", now_ms=LEASE + 4) in (ClaimStatus.CANCELLED, ClaimStatus.DONE)


def test_looking_only_removes_nothing(store):
    store.cancel("k", now_ms=0)
    assert store.uncancel_batch(["k", "other"], now_ms=1, look_only=True) == [
        U.CANCELLED,
        U.NOT_CANCELLED,
    ]
    assert _claim(store, "k", now_ms=2) is ClaimStatus.CANCELLED
    assert [s.skipped for s in (U.CANCELLED, U.NOT_CANCELLED, U.UNCANCELLED)] == [
        True,
        False,
        False,
    ]


def test_uncancelling_twice_is_not_cancelled_the_second_time(store):
    store.cancel("k", now_ms=0)
    assert store.uncancel_batch(["k"], now_ms=1) == [U.UNCANCELLED]
    assert store.uncancel_batch(["k"], now_ms=2) == [U.NOT_CANCELLED]
    assert store.cancel("k", now_ms=3).value == "unknown"  # cancellable again, from scratch


def test_an_empty_batch_answers_nothing(store):
    assert store.uncancel_batch([], now_ms=0) == []


def test_uncancels_racing_claims_never_let_a_cancelled_copy_run(opener):
    """An uncancel and a claim of each cancelled key from two clients at once: the claim
    is either cancelled (it came first) or claimed (after the uncancel), never both."""
    keys = [f"race-{n}" for n in range(100)]
    first, second = opener(), opener()
    first.cancel_batch([Cancel(key, 0) for key in keys])
    claims: dict[str, ClaimStatus] = {}
    undone: dict[str, UncancelStatus] = {}
    start = threading.Barrier(2)

    def claim_all() -> None:
        start.wait(30)
        for key in keys:
            claims[key] = first.claim(key, lease_ms=60_000, now_ms=1)

    def uncancel_all() -> None:
        start.wait(30)
        for key in reversed(keys):
            undone[key] = second.uncancel_batch([key], now_ms=1)[0]

    threads = [threading.Thread(target=claim_all), threading.Thread(target=uncancel_all)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for key in keys:
        assert undone[key] is U.UNCANCELLED, key  # a claim of a cancelled key takes no lease
        allowed = {ClaimStatus.CANCELLED, ClaimStatus.CLAIMED}
        if type(first).__name__ == "PostgresStore":  # a claim's snapshot (see the cancel race)
            allowed.add(ClaimStatus.BUSY)
        assert claims[key] in allowed, key


# --- misuse ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("keys", "now_ms", "match"),
    [
        (["ok", ""], 0, "non-empty str keys"),
        (["ok", None], 0, "non-empty str keys"),
        (["ok", b"k"], 0, "non-empty str keys"),
        ("k", 0, "list of keys"),
        (["k"], -1, "epoch milliseconds"),
        (["k"], True, "epoch milliseconds"),
        (["k"], 1.5, "epoch milliseconds"),
    ],
)
def test_a_bad_uncancel_is_refused_before_anything_is_removed(store, keys, now_ms, match):
    store.cancel("ok", now_ms=0)
    with pytest.raises(InvalidInput, match=match):
        store.uncancel_batch(keys, now_ms=now_ms)
    with pytest.raises(InvalidInput, match=match):
        run_uncancels(store, keys, now_ms=now_ms)
    assert _claim(store, "ok", now_ms=1) is ClaimStatus.CANCELLED  # still marked


def test_run_uncancels_refuses_a_store_that_cannot_uncancel():
    class Plain:
        def cancel_batch(self, ops: Any) -> list[Any]:
            return []

    with pytest.raises(InvalidInput, match="cannot remove cancel marks"):
        run_uncancels(Plain(), ["k"], now_ms=0)


def test_a_closed_store_refuses_uncancels_with_a_store_error(store):
    store.close()
    with pytest.raises(StoreError, match="is closed"):
        run_uncancels(store, ["k"], now_ms=0)


def test_a_failing_store_client_is_a_store_error_with_the_cause():
    class Broken:
        def uncancel_batch(self, keys: Any, *, now_ms: int, look_only: bool = False) -> Any:
            raise ConnectionError("server gone")

    with pytest.raises(StoreError, match="server gone") as caught:
        run_uncancels(Broken(), ["k"], now_ms=0)
    assert isinstance(caught.value.__cause__, ConnectionError)


def test_the_cancel_generation_is_what_an_uncancel_removes():
    assert CANCELLED_GENERATION == 2**53  # the Lua script and SQL compare against it
