"""Idempotency stores: one behaviour suite over every store, plus SQLite across processes."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from pathlib import Path

import pytest

from delayq.idempotency import ClaimStatus, IdempotencyStore, InMemoryStore, SQLiteStore

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
