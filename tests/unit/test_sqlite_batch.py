"""The SQLite store's grouped batches (a few many-row statements instead of one per call)
give exactly what the same calls one by one give: each result, and the table after."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest

from delayq.stores import _sqlite_grouped as grouping
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
    count = 2 * grouping.ROWS + 7
    claims: list[StoreOp] = [Claim(f"k{n}", LEASE, 0) for n in range(count)]
    assert store.run_batch(claims) == [ClaimStatus.CLAIMED] * count
    store.run_batch([Complete(f"k{n}", 1) for n in range(count)])
    assert store.run_batch(claims) == [ClaimStatus.DONE] * count


def mixed_ops(
    rng: random.Random, count: int, now: int, *, distinct: bool, lease: int = LEASE
) -> list[StoreOp]:
    """``count`` operations on keys in every state (new, done, busy, expired); with
    ``distinct=False`` keys repeat (the batch is then not grouped)."""
    pool = [f"{state}{n}" for state in ("new", "done", "busy", "old") for n in range(5)]
    pool += [f"fresh{n}" for n in range(count)]
    rng.shuffle(pool)
    keys = pool[:count] if distinct else [rng.choice(pool[:8]) for _ in range(count)]
    if not distinct:
        keys[-1] = keys[0]
    ops: list[StoreOp] = []
    for key in keys:
        kind = rng.choice((Claim, Claim, Complete, Release))
        if kind is Claim:
            ops.append(Claim(key, lease, now + rng.randint(0, 20)))
        elif kind is Complete:
            ops.append(Complete(key, now))
        else:
            ops.append(Release(key))
    return ops


@pytest.mark.parametrize("count", [2, 3, 8, 9, 11, 17, 31, 33, 65, 129, 2 * grouping.ROWS + 7])
@pytest.mark.parametrize(("distinct", "lease"), [(True, LEASE), (True, 0), (False, LEASE)])
def test_batches_of_every_padded_size_answer_as_the_calls_one_by_one(
    tmp_path: Path, monkeypatch, count: int, distinct: bool, lease: int
):
    """A grouped statement's rows are padded with copies of its last row (a statement per
    size class, not per size): the copies change no result and no row, a lease of 0
    (the copy of a won claim wins again) included."""
    grouped_batches = []

    def grouped_spy(db: sqlite3.Connection, ops: list[StoreOp]) -> object:
        results = real_grouped(db, ops)
        grouped_batches.append(results is not None)
        return results

    real_grouped = sqlite_store._grouped
    monkeypatch.setattr(sqlite_store, "_grouped", grouped_spy)
    now = 1_000_000
    ops = mixed_ops(random.Random(count), count, now, distinct=distinct, lease=lease)
    grouped, single = SQLiteStore(tmp_path / "g.db"), SQLiteStore(tmp_path / "s.db")
    for store in (grouped, single):
        seeded(store, now)
    grouped_batches.clear()
    assert grouped.run_batch(ops) == one_by_one(single, ops)
    assert table(grouped) == table(single)
    assert grouped_batches[0] is distinct  # the batch was grouped (repeated keys: not)


def test_padded_sizes_are_few_and_close_to_the_rows():
    sizes = {grouping.padded(rows) for rows in range(1, grouping.ROWS + 1)}
    assert max(sizes) == grouping.ROWS
    # 4 grouped statement kinds in every size, with room for the others, stay cached
    assert 4 * len(sizes) + 20 <= grouping.STATEMENTS
    for rows in range(1, grouping.ROWS + 1):
        assert rows <= grouping.padded(rows) <= rows + max(rows // 4, 0)
        assert grouping.padded(grouping.padded(rows)) == grouping.padded(rows)


def test_without_returning_a_batch_goes_call_by_call(tmp_path: Path, monkeypatch):
    """SQLite before 3.35 has no RETURNING: the batch is the calls one by one, in the
    same transaction, with the same answers."""
    now = 1_000_000
    ops = mixed_ops(random.Random(7), 40, now, distinct=True)
    grouped = SQLiteStore(tmp_path / "g.db")
    seeded(grouped, now)
    expected = grouped.run_batch(ops)
    monkeypatch.setattr(sqlite_store, "_RETURNING", False)
    old = SQLiteStore(tmp_path / "old.db")
    seeded(old, now)
    assert old.run_batch(ops) == expected
    assert table(old) == table(grouped)
