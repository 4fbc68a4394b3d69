"""The SQLite idempotency store: the embedded default, safe for several processes on one host."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from delayq.errors import ClaimLost, InvalidInput, StoreError
from delayq.stores._sqlite_grouped import RETURNING as _RETURNING
from delayq.stores._sqlite_grouped import STATEMENTS
from delayq.stores._sqlite_grouped import grouped as _grouped
from delayq.stores.base import (
    CANCELLED_GENERATION,
    Cancel,
    CancelStatus,
    Claim,
    ClaimStatus,
    Complete,
    Release,
    StoreOp,
    check_cancel,
    closed_error,
)
from delayq.stores.uncancel import UncancelStatus, check_uncancel, uncancel_status

__all__ = ["SQLiteStore", "immediate"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS delayq_idempotency (
    key          TEXT PRIMARY KEY,
    done_at      INTEGER,          -- epoch ms when completed, NULL while claimed
    lease_until  INTEGER NOT NULL, -- epoch ms when a claim expires
    generation   INTEGER NOT NULL DEFAULT 0,  -- copies below it are cancelled
    marked_at    INTEGER           -- epoch ms of the last cancel or reschedule, else NULL
)
"""

_MARK_COLUMNS = (
    ("generation", "INTEGER NOT NULL DEFAULT 0"),
    ("marked_at", "INTEGER"),
)
"""Columns added for cancellation: a file made by an older delayq gets them on open."""


class SQLiteStore:
    """A store in a SQLite file: the embedded default, safe for several processes on
    one host (WAL journal, ``BEGIN IMMEDIATE`` writes, a busy timeout).

    It is also a :class:`TransactionalStore`: a transactional handler writes its
    effects with the connection :meth:`transaction` yields, into tables of the same
    file, and the key is completed in the same commit. SQLite has one writer at a
    time: from its first write to the commit, a handler holds the file's write lock
    (others wait up to ``busy_timeout_ms``), so write late in the handler and keep
    the rest short, or use PostgreSQL for many concurrent transactional handlers.
    """

    blocking = True

    def __init__(self, path: str | Path, *, busy_timeout_ms: int = 10_000) -> None:
        if isinstance(busy_timeout_ms, bool) or not isinstance(busy_timeout_ms, int):
            raise InvalidInput(
                f"busy_timeout_ms is whole milliseconds (an int), not {busy_timeout_ms!r}"
            )
        if not isinstance(path, (str, Path)) or not str(path) or str(path) == ":memory:":
            raise InvalidInput(
                f"SQLiteStore needs a file path, not {path!r} (for a store in memory use "
                "InMemoryStore(): a ':memory:' database is private to one connection)"
            )
        self.path = Path(path)
        self._busy_timeout_s = busy_timeout_ms / 1000
        self._lock = threading.Lock()
        self._own = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._closed = False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = self._open()
            with self._lock:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute(_SCHEMA)
                _add_mark_columns(self._db)
        except (OSError, sqlite3.Error) as exc:
            for db in self._connections:
                db.close()
            raise StoreError(
                f"cannot open the SQLite idempotency store at {str(self.path)!r}: "
                f"{type(exc).__name__}: {exc} (the path must name a file in a directory "
                "this process can write)"
            ) from exc

    def __repr__(self) -> str:
        return f"SQLiteStore({str(self.path)!r})"

    def _check_open(self) -> None:
        if self._closed:
            raise closed_error(self)

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(
            str(self.path),
            timeout=self._busy_timeout_s,
            isolation_level=None,  # explicit transactions only
            check_same_thread=False,
            cached_statements=STATEMENTS,
        )
        db.execute("PRAGMA synchronous=NORMAL")
        self._connections.append(db)
        return db

    def claim(self, key: str, *, lease_ms: int, now_ms: int, generation: int = 0) -> ClaimStatus:
        status = self.run_batch([Claim(key, lease_ms, now_ms, generation)])[0]
        assert status is not None
        return status

    def complete(self, key: str, *, now_ms: int) -> None:
        self.run_batch([Complete(key, now_ms)])

    def release(self, key: str) -> None:
        self.run_batch([Release(key)])

    def cancel(
        self, key: str, *, now_ms: int, generation: int = CANCELLED_GENERATION
    ) -> CancelStatus:
        return self.cancel_batch([Cancel(key, now_ms, generation)])[0]

    def cancel_batch(self, ops: Sequence[Cancel]) -> list[CancelStatus]:
        """``ops`` in one ``BEGIN IMMEDIATE`` transaction: atomic against every claim."""
        for op in ops:
            check_cancel(op)
        with self._writing() as db:
            return [_sqlite_cancel(db, op) for op in ops]

    def uncancel_batch(
        self, keys: Sequence[str], *, now_ms: int, look_only: bool = False
    ) -> list[UncancelStatus]:
        """Remove cancels' marks in one ``BEGIN IMMEDIATE`` transaction (see
        :mod:`delayq.stores.uncancel`); ``look_only``: remove nothing."""
        check_uncancel(keys, now_ms)
        with self._writing() as db:
            return [_sqlite_uncancel(db, key, now_ms, look_only) for key in keys]

    def run_batch(self, ops: Sequence[StoreOp]) -> list[ClaimStatus | None]:
        """``ops`` in one ``BEGIN IMMEDIATE`` transaction: one commit for the lot."""
        with self._writing() as db:
            grouped = _grouped(db, ops) if len(ops) > 1 and _RETURNING else None
            return grouped or [_sqlite_apply(db, op) for op in ops]

    @contextmanager
    def _writing(self) -> Iterator[sqlite3.Connection]:
        """The store's connection in a ``BEGIN IMMEDIATE`` transaction (the write lock
        first, so a batch's reads and writes are atomic against every other client),
        under the store's lock; committed, or rolled back on any error."""
        with self._lock:
            self._check_open()
            with immediate(self._db) as db:
                yield db

    @contextmanager
    def transaction(self, key: str, *, lease_until_ms: int, now_ms: int) -> Iterator[Any]:
        db = getattr(self._own, "db", None)
        with self._lock:
            self._check_open()
            if db is None:
                db = self._own.db = self._open()
        # Deferred: the write lock is taken at the handler's first write, not while it
        # waits on other things (a slow or timed-out handler holds up no one until then).
        db.execute("BEGIN")
        try:
            yield db
            if not db.in_transaction:
                raise InvalidInput(
                    "the handler ended delayq's transaction (commit or rollback): leave "
                    "that to delayq, which commits your writes with the key's completion"
                )
            finished = db.execute(
                "UPDATE delayq_idempotency SET done_at = ? "
                "WHERE key = ? AND done_at IS NULL AND lease_until = ?",
                (now_ms, key, lease_until_ms),
            ).rowcount
            if finished != 1:
                raise ClaimLost(
                    f"the claim on key {key!r} was lost before the handler's transaction "
                    "could commit; its writes were rolled back"
                )
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def done_keys(self) -> Iterator[tuple[str, int]]:
        """Every completed key and when, a page at a time (the lock is not held
        between pages, so the caller may write to the store meanwhile)."""
        after = ""
        while True:
            with self._lock:
                self._check_open()
                page = self._db.execute(
                    "SELECT key, done_at FROM delayq_idempotency "
                    "WHERE done_at IS NOT NULL AND key > ? ORDER BY key LIMIT 500",
                    (after,),
                ).fetchall()
            if not page:
                return
            for key, done_at in page:
                yield str(key), int(done_at)
            after = page[-1][0]

    def prune(self, *, older_than_ms: int) -> int:
        with self._lock:
            self._check_open()
            cursor = self._db.execute(
                "DELETE FROM delayq_idempotency WHERE ((done_at IS NOT NULL AND done_at < ?) "
                "OR (done_at IS NULL AND lease_until < ?)) AND COALESCE(marked_at, -1) < ?",
                (older_than_ms, older_than_ms, older_than_ms),
            )
            return cursor.rowcount

    def close(self) -> None:
        """Close every connection; the store refuses any further call."""
        with self._lock:
            self._closed = True
            for db in self._connections:
                db.close()
            self._connections.clear()


def _sqlite_apply(db: sqlite3.Connection, op: StoreOp) -> ClaimStatus | None:
    if isinstance(op, Claim):
        row = db.execute(
            "SELECT done_at, lease_until, generation FROM delayq_idempotency WHERE key = ?",
            (op.key,),
        ).fetchone()
        if row is not None and row[2] > op.generation:
            return ClaimStatus.CANCELLED
        if row is not None and row[0] is not None:
            return ClaimStatus.DONE
        if row is not None and row[1] > op.now_ms:
            return ClaimStatus.BUSY
        db.execute(
            "INSERT INTO delayq_idempotency (key, done_at, lease_until) "
            "VALUES (?, NULL, ?) ON CONFLICT(key) DO UPDATE SET "
            "done_at = NULL, lease_until = excluded.lease_until",
            (op.key, op.lease_until_ms),
        )
        return ClaimStatus.CLAIMED
    if isinstance(op, Complete):
        db.execute(
            "INSERT INTO delayq_idempotency (key, done_at, lease_until) VALUES (?, ?, ?) "
            "ON CONFLICT(key) DO UPDATE SET done_at = excluded.done_at",
            (op.key, op.now_ms, op.now_ms),
        )
    else:
        db.execute(  # a cancelled or rescheduled key keeps its mark
            "UPDATE delayq_idempotency SET lease_until = 0 "
            "WHERE key = ? AND done_at IS NULL AND marked_at IS NOT NULL",
            (op.key,),
        )
        db.execute(
            "DELETE FROM delayq_idempotency WHERE key = ? AND done_at IS NULL "
            "AND marked_at IS NULL",
            (op.key,),
        )
    return None


def _sqlite_cancel(db: sqlite3.Connection, op: Cancel) -> CancelStatus:
    """One :class:`Cancel`, inside the caller's write transaction."""
    row = db.execute(
        "SELECT done_at, lease_until, generation FROM delayq_idempotency WHERE key = ?",
        (op.key,),
    ).fetchone()
    if row is not None:
        done_at, lease_until, generation = row
        if done_at is not None:
            return CancelStatus.ALREADY_HANDLED
        if lease_until > op.now_ms:
            return CancelStatus.IN_PROGRESS
        if generation >= CANCELLED_GENERATION:
            return CancelStatus.ALREADY_CANCELLED
        if generation >= op.generation:
            return CancelStatus.OUTDATED
    db.execute(
        "INSERT INTO delayq_idempotency (key, done_at, lease_until, generation, marked_at) "
        "VALUES (?, NULL, 0, ?, ?) ON CONFLICT(key) DO UPDATE SET lease_until = 0, "
        "generation = excluded.generation, marked_at = excluded.marked_at",
        (op.key, op.generation, op.now_ms),
    )
    return CancelStatus.UNKNOWN if row is None else CancelStatus.CANCELLED


def _sqlite_uncancel(db: sqlite3.Connection, key: str, now_ms: int, look: bool) -> UncancelStatus:
    row = db.execute(
        "SELECT done_at, lease_until, generation FROM delayq_idempotency WHERE key = ?", (key,)
    ).fetchone()
    if row is None:
        return UncancelStatus.NOT_CANCELLED
    status = uncancel_status(*row, now_ms=now_ms, look_only=look)
    if status is UncancelStatus.UNCANCELLED:
        db.execute("DELETE FROM delayq_idempotency WHERE key = ?", (key,))
    return status


def _add_mark_columns(db: sqlite3.Connection) -> None:
    """Add the cancellation columns to a table made by an older delayq (in a write
    transaction: several processes may open the file at once)."""
    with immediate(db):
        have = {row[1] for row in db.execute("PRAGMA table_info(delayq_idempotency)")}
        for name, kind in _MARK_COLUMNS:
            if name not in have:
                db.execute(f"ALTER TABLE delayq_idempotency ADD COLUMN {name} {kind}")


@contextmanager
def immediate(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """A ``BEGIN IMMEDIATE`` transaction on ``db``: committed, or rolled back on any error.
    A failed ``COMMIT`` (a full disk) may have rolled back already: the ``ROLLBACK`` is
    then skipped, so the error said is the commit's, not "no transaction is active"."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            with suppress(sqlite3.Error):
                db.execute("ROLLBACK")
        raise
