"""Idempotency stores: claim a key before the handler runs, record it after.

Delivery is at least once (a redelivery after a crash, a re-sent publish whose
confirm was lost, a republish-then-ack cut in the middle), so a side effect
happens once only when the handler is idempotent. A store makes it so: the
consumer claims the message's key (the handler's business key, else the message
id) before running the handler, completes it after success and releases it on
failure. A claim has a lease, so a crashed consumer's claim expires; completed
keys are kept for a retention period and then pruned.

>>> store = InMemoryStore()
>>> store.claim("order-42", lease_ms=60_000, now_ms=0)
<ClaimStatus.CLAIMED: 'claimed'>
>>> store.complete("order-42", now_ms=10)
>>> store.claim("order-42", lease_ms=60_000, now_ms=20)
<ClaimStatus.DONE: 'done'>
"""

from __future__ import annotations

import enum
import functools
import inspect
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from delayq.errors import ClaimLost, DelayqError, InvalidInput, StoreError
from delayq.scrub import scrub

__all__ = [
    "BatchingStore",
    "Claim",
    "ClaimStatus",
    "Complete",
    "IdempotencyStore",
    "InMemoryStore",
    "Release",
    "SQLiteStore",
    "StoreOp",
    "TransactionalStore",
    "answer_op",
    "call_in_transaction",
    "check_transactional",
    "closed_error",
    "run_ops",
    "store_error",
    "supports_transactions",
]


class ClaimStatus(str, enum.Enum):
    CLAIMED = "claimed"
    """The caller holds the key now: run the handler, then complete or release."""
    DONE = "done"
    """The key was handled before: skip, it is a duplicate."""
    BUSY = "busy"
    """Another consumer holds a live lease on the key: try again later."""


@runtime_checkable
class IdempotencyStore(Protocol):
    """What a consumer needs from a store. Times are epoch milliseconds."""

    blocking: bool
    """True when calls do I/O (the async consumer then runs them in a thread)."""

    def claim(self, key: str, *, lease_ms: int, now_ms: int) -> ClaimStatus: ...

    def complete(self, key: str, *, now_ms: int) -> None: ...

    def release(self, key: str) -> None: ...

    def prune(self, *, older_than_ms: int) -> int:
        """Forget keys completed before ``older_than_ms`` (and expired claims)."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Claim:
    key: str
    lease_ms: int
    now_ms: int

    @property
    def lease_until_ms(self) -> int:
        """When this claim's lease ends; also the claim's fencing value in a transaction."""
        return self.now_ms + self.lease_ms


@dataclass(frozen=True, slots=True)
class Complete:
    key: str
    now_ms: int


@dataclass(frozen=True, slots=True)
class Release:
    key: str


StoreOp = Claim | Complete | Release
"""One store operation; the async consumer sends those of one event-loop turn together."""


@runtime_checkable
class BatchingStore(Protocol):
    """A store that performs several operations in one round trip (one transaction,
    one pipeline), in order; the result list has a :class:`ClaimStatus` per
    :class:`Claim` and ``None`` per other operation. If it raises, none of the
    operations may be assumed done."""

    def run_batch(self, ops: Sequence[StoreOp]) -> list[ClaimStatus | None]: ...


@runtime_checkable
class TransactionalStore(Protocol):
    """A store that can complete a key in the same database transaction as the
    handler's own writes: the *inbox* pattern, so that a crash anywhere leaves
    either both (the key is done: a redelivery is skipped) or neither (the claim's
    lease runs out and the handler runs again from scratch).

    ``transaction`` opens a transaction on a connection of its own and yields that
    connection (``sqlite3.Connection``, ``psycopg.Connection``) for the handler's
    writes. On a clean exit it marks ``key`` done, if the caller's claim (the one
    whose lease ends at ``lease_until_ms``) still holds, and commits; if the claim
    is gone it raises :class:`~delayq.errors.ClaimLost` and rolls back; on an
    exception it rolls back. The handler must not commit or roll back itself.
    """

    def transaction(
        self, key: str, *, lease_until_ms: int, now_ms: int
    ) -> AbstractContextManager[Any]: ...


def supports_transactions(store: object) -> bool:
    return isinstance(store, TransactionalStore)


def apply_op(store: IdempotencyStore, op: StoreOp) -> ClaimStatus | None:
    if isinstance(op, Claim):
        return store.claim(op.key, lease_ms=op.lease_ms, now_ms=op.now_ms)
    if isinstance(op, Complete):
        store.complete(op.key, now_ms=op.now_ms)
    else:
        store.release(op.key)
    return None


@functools.lru_cache(maxsize=64)
def _batches(store_type: type) -> bool:
    """Whether a store class has ``run_batch`` (a Protocol ``isinstance`` check costs tens
    of microseconds: too much to pay per delivery)."""
    return callable(getattr(store_type, "run_batch", None))


def run_ops(store: IdempotencyStore, ops: Sequence[StoreOp]) -> list[ClaimStatus | None]:
    """``ops`` in order, in one batch when the store can, else one by one.

    A failure of the store's client (server down, disk full) is raised as
    :class:`~delayq.errors.StoreError`, the client's error in ``__cause__``.
    """
    try:
        if _batches(type(store)):
            return store.run_batch(ops)  # type: ignore[attr-defined, no-any-return]
        return [apply_op(store, op) for op in ops]
    except DelayqError:
        raise
    except Exception as exc:
        raise store_error(store, exc) from exc


def answer_op(store: IdempotencyStore, op: StoreOp) -> ClaimStatus | StoreError | None:
    """What :func:`run_ops` gives for ``op`` alone, or its :class:`StoreError` (the answer
    a delivery flow is sent for a store step: see :mod:`delayq.consume.flow`)."""
    try:
        return run_ops(store, [op])[0]
    except StoreError as exc:
        return exc


def closed_error(store: object) -> StoreError:
    return StoreError(
        f"{store!r} is closed: make a new store (a consumer never closes the store it is "
        "given, so close it only when every consumer using it has stopped)"
    )


def store_error(store: object, exc: BaseException) -> StoreError:
    # Logged by the consumers: a client's error may quote its DSN, password included.
    return StoreError(scrub(f"idempotency store {store!r} failed: {type(exc).__name__}: {exc}"))


def call_in_transaction(
    store: TransactionalStore,
    handler: Callable[[Any, Any], object],
    value: Any,
    *,
    key: str,
    lease_until_ms: int,
    now_ms: int,
) -> None:
    """Run a transactional handler: ``handler(value, tx)`` inside ``store.transaction``."""
    with store.transaction(key, lease_until_ms=lease_until_ms, now_ms=now_ms) as tx:
        handler(value, tx)


def check_transactional(store: object, handler: Callable[..., Any]) -> None:
    """Refuse, before consuming, a transactional consumer that could not keep its promise."""
    if store is None or not supports_transactions(store):
        raise InvalidInput(
            f"transactional=True needs a store that commits the handler's writes with the "
            f"key (SQLiteStore or PostgresStore), not {store!r}"
        )
    if inspect.iscoroutinefunction(handler):
        raise InvalidInput(
            "a transactional handler is a plain function `handler(body, tx)`: it runs in a "
            "thread with the transaction's connection"
        )


class InMemoryStore:
    """A store in this process's memory: for tests and single-process tools."""

    blocking = False

    def __init__(self) -> None:
        self._done: dict[str, int] = {}
        self._leases: dict[str, int] = {}
        self._lock = threading.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"InMemoryStore(keys={len(self._done)})"

    def _check_open(self) -> None:
        if self._closed:
            raise closed_error(self)

    def claim(self, key: str, *, lease_ms: int, now_ms: int) -> ClaimStatus:
        with self._lock:
            self._check_open()
            if key in self._done:
                return ClaimStatus.DONE
            if self._leases.get(key, -1) > now_ms:
                return ClaimStatus.BUSY
            self._leases[key] = now_ms + lease_ms
            return ClaimStatus.CLAIMED

    def complete(self, key: str, *, now_ms: int) -> None:
        with self._lock:
            self._check_open()
            self._leases.pop(key, None)
            self._done[key] = now_ms

    def release(self, key: str) -> None:
        with self._lock:
            self._check_open()
            self._leases.pop(key, None)

    def done_keys(self) -> Iterator[tuple[str, int]]:
        """Every completed key and when (see :func:`delayq.stores.key_scope.copy_unscoped_keys`)."""
        with self._lock:
            self._check_open()
            done = list(self._done.items())
        yield from done

    def prune(self, *, older_than_ms: int) -> int:
        with self._lock:
            self._check_open()
            old = [k for k, at in self._done.items() if at < older_than_ms]
            for key in old:
                del self._done[key]
            expired = [k for k, until in self._leases.items() if until < older_than_ms]
            for key in expired:
                del self._leases[key]
            return len(old) + len(expired)

    def close(self) -> None:
        """Forget every key; the store refuses any further call."""
        with self._lock:
            self._closed = True
            self._done.clear()
            self._leases.clear()


_SCHEMA = """
CREATE TABLE IF NOT EXISTS delayq_idempotency (
    key          TEXT PRIMARY KEY,
    done_at      INTEGER,          -- epoch ms when completed, NULL while claimed
    lease_until  INTEGER NOT NULL  -- epoch ms when a claim expires
)
"""


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
        )
        db.execute("PRAGMA synchronous=NORMAL")
        self._connections.append(db)
        return db

    def claim(self, key: str, *, lease_ms: int, now_ms: int) -> ClaimStatus:
        status = self.run_batch([Claim(key, lease_ms, now_ms)])[0]
        assert status is not None
        return status

    def complete(self, key: str, *, now_ms: int) -> None:
        self.run_batch([Complete(key, now_ms)])

    def release(self, key: str) -> None:
        self.run_batch([Release(key)])

    def run_batch(self, ops: Sequence[StoreOp]) -> list[ClaimStatus | None]:
        """``ops`` in one ``BEGIN IMMEDIATE`` transaction: one commit for the lot."""
        with self._lock:
            self._check_open()
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                results = [_sqlite_apply(db, op) for op in ops]
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            return results

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
                "DELETE FROM delayq_idempotency WHERE (done_at IS NOT NULL AND done_at < ?) "
                "OR (done_at IS NULL AND lease_until < ?)",
                (older_than_ms, older_than_ms),
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
            "SELECT done_at, lease_until FROM delayq_idempotency WHERE key = ?", (op.key,)
        ).fetchone()
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
        db.execute("DELETE FROM delayq_idempotency WHERE key = ? AND done_at IS NULL", (op.key,))
    return None
