"""Idempotency stores: one behaviour suite over every store, plus SQLite across processes."""

from __future__ import annotations

import multiprocessing
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from delayq.errors import ClaimLost, InvalidInput, StoreError
from delayq.idempotency import (
    Claim,
    ClaimStatus,
    Complete,
    IdempotencyStore,
    InMemoryStore,
    Release,
    SQLiteStore,
    TransactionalStore,
    check_transactional,
    run_ops,
)

LEASE = 1_000


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[IdempotencyStore]:
    made: IdempotencyStore = (
        InMemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "keys.db")
    )
    yield made
    made.close()


def test_stores_satisfy_the_protocol(store):
    assert isinstance(store, IdempotencyStore)


def test_claim_then_complete_makes_later_claims_duplicates(store):
    assert store.claim("k", lease_ms=LEASE, now_ms=0) is ClaimStatus.CLAIMED
    store.complete("k", now_ms=5)
    assert store.claim("k", lease_ms=LEASE, now_ms=10) is ClaimStatus.DONE
    assert store.claim("k", lease_ms=LEASE, now_ms=10**9) is ClaimStatus.DONE


def test_a_live_claim_is_busy_for_others(store):
    assert store.claim("k", lease_ms=LEASE, now_ms=0) is ClaimStatus.CLAIMED
    assert store.claim("k", lease_ms=LEASE, now_ms=999) is ClaimStatus.BUSY


def test_a_crashed_consumers_claim_expires_with_its_lease(store):
    assert store.claim("k", lease_ms=LEASE, now_ms=0) is ClaimStatus.CLAIMED
    assert store.claim("k", lease_ms=LEASE, now_ms=1_000) is ClaimStatus.CLAIMED


def test_release_lets_the_next_attempt_claim(store):
    store.claim("k", lease_ms=LEASE, now_ms=0)
    store.release("k")
    assert store.claim("k", lease_ms=LEASE, now_ms=1) is ClaimStatus.CLAIMED


def test_release_does_not_forget_a_completed_key(store):
    store.claim("k", lease_ms=LEASE, now_ms=0)
    store.complete("k", now_ms=1)
    store.release("k")
    assert store.claim("k", lease_ms=LEASE, now_ms=2) is ClaimStatus.DONE


def test_keys_are_independent(store):
    store.claim("a", lease_ms=LEASE, now_ms=0)
    store.complete("a", now_ms=0)
    assert store.claim("b", lease_ms=LEASE, now_ms=0) is ClaimStatus.CLAIMED


def test_prune_forgets_old_completed_keys_and_expired_claims(store):
    store.claim("old", lease_ms=LEASE, now_ms=0)
    store.complete("old", now_ms=100)
    store.claim("new", lease_ms=LEASE, now_ms=0)
    store.complete("new", now_ms=5_000)
    store.claim("stale-claim", lease_ms=LEASE, now_ms=0)
    assert store.prune(older_than_ms=4_000) == 2
    assert store.claim("old", lease_ms=LEASE, now_ms=6_000) is ClaimStatus.CLAIMED
    assert store.claim("new", lease_ms=LEASE, now_ms=6_000) is ClaimStatus.DONE


def _claim_all(path: str, keys: list[str], out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    store = SQLiteStore(path)
    won = [k for k in keys if store.claim(k, lease_ms=60_000, now_ms=0) is ClaimStatus.CLAIMED]
    store.close()
    out.put(won)


def test_sqlite_claims_are_exclusive_across_processes(tmp_path):
    path = str(tmp_path / "shared.db")
    SQLiteStore(path).close()
    keys = [f"k{n}" for n in range(300)]
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_claim_all, args=(path, keys, out)) for _ in range(4)]
    for proc in procs:
        proc.start()
    won = [k for _ in procs for k in out.get(timeout=60)]
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    assert sorted(won) == sorted(keys), "a key was claimed twice or not at all"


# --- batches: the same answers as one call at a time --------------------------------------------


def test_a_batch_runs_in_order_with_one_result_per_operation(store):
    results = run_ops(
        store,
        [
            Claim("a", LEASE, 0),
            Claim("a", LEASE, 1),
            Complete("a", 2),
            Claim("a", LEASE, 3),
            Claim("b", LEASE, 4),
            Release("b"),
            Claim("b", LEASE, 5),
        ],
    )
    C, D, B = ClaimStatus.CLAIMED, ClaimStatus.DONE, ClaimStatus.BUSY
    assert results == [C, B, None, D, C, None, C]


def test_an_empty_batch_is_fine(store):
    assert run_ops(store, []) == []


class _Broken(InMemoryStore):
    def claim(self, key: str, *, lease_ms: int, now_ms: int) -> ClaimStatus:
        raise OSError("disk on fire")


def test_a_failing_store_raises_store_error_with_the_cause():
    with pytest.raises(StoreError, match="disk on fire") as caught:
        run_ops(_Broken(), [Claim("k", LEASE, 0)])
    assert isinstance(caught.value.__cause__, OSError)


def test_sqlite_batch_is_all_or_nothing(tmp_path):
    store = SQLiteStore(tmp_path / "keys.db")
    with pytest.raises(StoreError):
        run_ops(store, [Claim("a", LEASE, 0), Claim(["unbindable"], LEASE, 0)])  # type: ignore[arg-type]
    assert store.claim("a", lease_ms=LEASE, now_ms=0) is ClaimStatus.CLAIMED
    store.close()


# --- transactions: the handler's writes commit with the key ---------------------------------------


@dataclass
class TxHarness:
    """A transactional store, and how a handler writes (and a test counts) its effects."""

    store: Any
    write: Callable[[Any, str], None]
    count: Callable[[str], int]


@pytest.fixture
def tx_store(tmp_path: Path) -> Iterator[TxHarness]:
    path = tmp_path / "app.db"
    store = SQLiteStore(path)
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE effects (key TEXT)")

    def count(key: str) -> int:
        with sqlite3.connect(path) as db:
            row = db.execute("SELECT COUNT(*) FROM effects WHERE key = ?", (key,)).fetchone()
            return int(row[0])

    def write(tx: Any, key: str) -> None:
        tx.execute("INSERT INTO effects VALUES (?)", (key,))

    yield TxHarness(store, write, count)
    store.close()


def _claimed(store: Any, key: str, now_ms: int = 0) -> int:
    assert store.claim(key, lease_ms=LEASE, now_ms=now_ms) is ClaimStatus.CLAIMED
    return now_ms + LEASE


def test_transactional_stores_satisfy_the_protocol(tx_store):
    assert isinstance(tx_store.store, TransactionalStore)


def test_a_transaction_commits_the_effect_and_the_key_together(tx_store):
    until = _claimed(tx_store.store, "k")
    with tx_store.store.transaction("k", lease_until_ms=until, now_ms=5) as tx:
        tx_store.write(tx, "k")
        assert tx_store.count("k") == 0  # not visible before the commit
    assert tx_store.count("k") == 1
    assert tx_store.store.claim("k", lease_ms=LEASE, now_ms=10) is ClaimStatus.DONE


def test_a_failing_handler_rolls_back_its_effect_and_leaves_the_key_claimable(tx_store):
    until = _claimed(tx_store.store, "k")
    with pytest.raises(ZeroDivisionError):
        with tx_store.store.transaction("k", lease_until_ms=until, now_ms=5) as tx:
            tx_store.write(tx, "k")
            raise ZeroDivisionError
    assert tx_store.count("k") == 0
    tx_store.store.release("k")
    assert tx_store.store.claim("k", lease_ms=LEASE, now_ms=10) is ClaimStatus.CLAIMED


def test_a_released_claim_rolls_the_transaction_back(tx_store):
    """A timed-out handler's thread finishing late must not commit: its claim was released."""
    until = _claimed(tx_store.store, "k")
    tx_store.store.release("k")
    with pytest.raises(ClaimLost):
        with tx_store.store.transaction("k", lease_until_ms=until, now_ms=5) as tx:
            tx_store.write(tx, "k")
    assert tx_store.count("k") == 0


def test_a_claim_taken_over_after_its_lease_rolls_the_late_transaction_back(tx_store):
    until = _claimed(tx_store.store, "k", now_ms=0)
    taken = _claimed(tx_store.store, "k", now_ms=LEASE + 1)  # the lease ran out
    with pytest.raises(ClaimLost):
        with tx_store.store.transaction("k", lease_until_ms=until, now_ms=LEASE + 2) as tx:
            tx_store.write(tx, "k")
    with tx_store.store.transaction("k", lease_until_ms=taken, now_ms=LEASE + 3) as tx:
        tx_store.write(tx, "k")
    assert tx_store.count("k") == 1


def test_a_completed_key_cannot_be_completed_again_by_a_transaction(tx_store):
    until = _claimed(tx_store.store, "k")
    tx_store.store.complete("k", now_ms=1)
    with pytest.raises(ClaimLost):
        with tx_store.store.transaction("k", lease_until_ms=until, now_ms=2) as tx:
            tx_store.write(tx, "k")
    assert tx_store.count("k") == 0


def test_sqlite_handler_must_not_commit_itself(tmp_path):
    store = SQLiteStore(tmp_path / "keys.db")
    until = _claimed(store, "k")
    with pytest.raises(InvalidInput, match="leave that to delayq"):
        with store.transaction("k", lease_until_ms=until, now_ms=1) as tx:
            tx.execute("COMMIT")
    assert store.claim("k", lease_ms=LEASE, now_ms=2) is ClaimStatus.BUSY
    store.close()


def test_transactional_consumers_need_a_transactional_store_and_a_plain_handler(tmp_path):
    def handler(body: Any, tx: Any) -> None: ...

    async def async_handler(body: Any, tx: Any) -> None: ...

    with pytest.raises(InvalidInput, match="SQLiteStore or PostgresStore"):
        check_transactional(InMemoryStore(), handler)
    with pytest.raises(InvalidInput, match="SQLiteStore or PostgresStore"):
        check_transactional(None, handler)
    store = SQLiteStore(tmp_path / "keys.db")
    with pytest.raises(InvalidInput, match="plain function"):
        check_transactional(store, async_handler)
    check_transactional(store, handler)
    store.close()
