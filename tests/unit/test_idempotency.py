"""Idempotency stores: one behaviour suite over every store, plus SQLite across processes."""

from __future__ import annotations

import multiprocessing
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayq.errors import ClaimLost, InvalidInput, StoreError
from delayq.stores.base import (
    Claim,
    ClaimStatus,
    Complete,
    IdempotencyStore,
    Release,
    TransactionalStore,
    check_transactional,
    run_ops,
)
from delayq.stores.key_scope import KeyScope, copy_unscoped_keys, is_queue_scoped, scoped_key
from delayq.stores.memory import InMemoryStore
from delayq.stores.sqlite import SQLiteStore

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


# --- key scopes, and keys written by 0.1 ---------------------------------------------------------

QUEUE_NAMES = st.text(alphabet="abz09._-:/%q", min_size=1, max_size=12)
KEYS = st.text(min_size=1, max_size=12)


@given(QUEUE_NAMES, KEYS, QUEUE_NAMES, KEYS)
def test_queue_scoped_keys_never_collide_across_queues(queue_a, key_a, queue_b, key_b):
    """Dots, colons, percent signs in a queue name or a key cannot make two
    (queue, key) pairs share a stored key."""
    stored_a = scoped_key(key_a, queue_a, KeyScope.QUEUE)
    stored_b = scoped_key(key_b, queue_b, KeyScope.QUEUE)
    assert (stored_a == stored_b) == ((queue_a, key_a) == (queue_b, key_b))
    assert is_queue_scoped(stored_a)
    assert scoped_key(key_a, queue_a, KeyScope.SHARED) == key_a


def test_key_scope_accepts_its_names_and_refuses_anything_else():
    assert KeyScope.parse("queue") is KeyScope.QUEUE
    assert KeyScope.parse(KeyScope.SHARED) is KeyScope.SHARED
    for wrong in ("global", "Queue", True, None, 1):
        with pytest.raises(InvalidInput, match=r"key_scope must be KeyScope\.QUEUE"):
            KeyScope.parse(wrong)


def _done(store: Any, key: str, at: int) -> None:
    assert store.claim(key, lease_ms=LEASE, now_ms=at) is ClaimStatus.CLAIMED
    store.complete(key, now_ms=at)


def test_copy_unscoped_keys_marks_0_1_keys_done_in_each_queue_named(store):
    now = 1_000_000
    _done(store, "m1", 100)  # 0.1's form: the bare message id
    _done(store, "m2", 200)
    store.claim("m3", lease_ms=LEASE, now_ms=300)  # claimed, never completed: not copied
    in_b = scoped_key("m2", "b.queue", KeyScope.QUEUE)
    store.claim(in_b, lease_ms=10 * 60_000, now_ms=now)  # a new consumer holds it: left alone
    _done(store, scoped_key("x", "a:queue", KeyScope.QUEUE), 400)  # already scoped: not copied

    assert copy_unscoped_keys(store, ["a:queue", "b.queue"], now_ms=now + 1) == 3
    assert copy_unscoped_keys(store, ["a:queue", "b.queue"], now_ms=now + 2) == 0  # idempotent

    def status(key: str, queue: str) -> ClaimStatus:
        return store.claim(scoped_key(key, queue, KeyScope.QUEUE), lease_ms=LEASE, now_ms=now + 3)

    assert status("m1", "a:queue") is ClaimStatus.DONE
    assert status("m1", "b.queue") is ClaimStatus.DONE
    assert status("m2", "a:queue") is ClaimStatus.DONE
    assert status("m2", "b.queue") is ClaimStatus.BUSY  # still the live consumer's claim
    assert status("m3", "a:queue") is ClaimStatus.CLAIMED
    assert status("m1", "other") is ClaimStatus.CLAIMED  # only the queues named
    # The copies keep the original completion time: pruned when the 0.1 key would be.
    store.prune(older_than_ms=150)
    assert status("m1", "a:queue") is ClaimStatus.CLAIMED
    assert status("m2", "a:queue") is ClaimStatus.DONE


def test_copy_unscoped_keys_goes_through_every_page_of_keys(store):
    ops: list[Any] = []
    for n in range(1_234):
        ops += [Claim(f"k{n}", LEASE, 0), Complete(f"k{n}", 10)]
    run_ops(store, ops)
    assert copy_unscoped_keys(store, ["q1"], now_ms=20) == 1_234
    assert store.claim(scoped_key("k1233", "q1", KeyScope.QUEUE), lease_ms=LEASE, now_ms=30) is (
        ClaimStatus.DONE
    )


def test_copy_unscoped_keys_refuses_a_string_of_queues_and_a_store_that_cannot_list():
    with pytest.raises(InvalidInput, match="list of queue names"):
        copy_unscoped_keys(InMemoryStore(), "billing")
    with pytest.raises(InvalidInput, match="non-empty list"):
        copy_unscoped_keys(InMemoryStore(), [])

    class Opaque:
        blocking = False

    with pytest.raises(InvalidInput, match="cannot list its keys"):
        copy_unscoped_keys(Opaque(), ["billing"])  # type: ignore[arg-type]


def test_a_closed_store_refuses_every_call_with_a_store_error(store):
    store.close()
    calls: list[Callable[[], object]] = [
        lambda: store.claim("k", lease_ms=LEASE, now_ms=0),
        lambda: store.complete("k", now_ms=0),
        lambda: store.release("k"),
        lambda: store.prune(older_than_ms=0),
        lambda: list(store.done_keys()),
        lambda: run_ops(store, [Claim("k", LEASE, 0)]),
    ]
    for call in calls:
        with pytest.raises(StoreError, match="is closed: make a new store"):
            call()
