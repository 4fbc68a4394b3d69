"""The SQLite store's grouped batches (a few many-row statements instead of one per call)
give exactly what the same calls one by one give: each result, and the table after."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest

from delayq.stores import sqlite as sqlite_store
from delayq.stores.base import Claim, ClaimStatus, Complete, Release, StoreOp
from delayq.stores.sqlite import SQLiteStore

LEASE = 1_000


def table(store: SQLiteStore) -> list[tuple[str, int | None, int]]:
    db = sqlite3.connect(store.path)
    try:
        return sorted(db.execute("SELECT key, done_at, lease_until FROM delayq_idempotency"))
    finally:
        db.close()


def one_by_one(store: SQLiteStore, ops: list[StoreOp]) -> list[ClaimStatus | None]:
    return [store.run_batch([op])[0] for op in ops]


def seeded(store: SQLiteStore, now: int) -> None:
    """Keys in every state: done, leased (busy), leased but expired."""
    store.run_batch([Claim(f"done{n}", LEASE, now - 5_000) for n in range(5)])
    store.run_batch([Complete(f"done{n}", now - 4_000) for n in range(5)])
    store.run_batch([Claim(f"busy{n}", LEASE, now - 10) for n in range(5)])
    store.run_batch([Claim(f"old{n}", LEASE, now - 5_000) for n in range(5)])


@pytest.mark.parametrize("seed", range(20))
def test_a_grouped_batch_answers_and_writes_as_the_calls_one_by_one(tmp_path: Path, seed: int):
    rng = random.Random(seed)
    now = 1_000_000
    keys = [f"{state}{n}" for state in ("new", "done", "busy", "old") for n in range(5)]
    rng.shuffle(keys)
    ops: list[StoreOp] = []
    for key in keys[: rng.randint(2, len(keys))]:
        kind = rng.choice((Claim, Claim, Complete, Release))
        if kind is Claim:
            ops.append(Claim(key, LEASE, now + rng.randint(0, 20)))
        elif kind is Complete:
            ops.append(Complete(key, now))
        else:
            ops.append(Release(key))
    grouped, single = SQLiteStore(tmp_path / "g.db"), SQLiteStore(tmp_path / "s.db")
    for store in (grouped, single):
        seeded(store, now)
    assert grouped.run_batch(ops) == one_by_one(single, ops)
    assert table(grouped) == table(single)


def test_every_state_of_a_claim_in_one_grouped_batch(tmp_path: Path):
    now = 1_000_000
    store = SQLiteStore(tmp_path / "k.db")
    seeded(store, now)
    ops: list[StoreOp] = [Claim(k, LEASE, now) for k in ("new0", "done0", "busy0", "old0")]
    assert store.run_batch(ops) == [
        ClaimStatus.CLAIMED,
        ClaimStatus.DONE,
        ClaimStatus.BUSY,
        ClaimStatus.CLAIMED,
    ]


def test_two_calls_on_one_key_keep_their_order(tmp_path: Path):
    """A release then a claim of the same key (a failed delivery, its redelivery): the
    claim sees the release, so the batch is not grouped."""
    store = SQLiteStore(tmp_path / "k.db")
    store.run_batch([Claim("k", LEASE, 0)])
    assert store.run_batch([Release("k"), Claim("k", LEASE, 1)]) == [None, ClaimStatus.CLAIMED]
    assert store.run_batch([Claim("k", LEASE, 2), Release("k")]) == [ClaimStatus.BUSY, None]


def test_more_rows_than_one_statement_takes(tmp_path: Path):
    store = SQLiteStore(tmp_path / "k.db")
    count = 2 * sqlite_store._ROWS + 7
    claims: list[StoreOp] = [Claim(f"k{n}", LEASE, 0) for n in range(count)]
    assert store.run_batch(claims) == [ClaimStatus.CLAIMED] * count
    store.run_batch([Complete(f"k{n}", 1) for n in range(count)])
    assert store.run_batch(claims) == [ClaimStatus.DONE] * count
