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
import sqlite3
import threading
from pathlib import Path
from typing import Protocol, runtime_checkable

__all__ = ["ClaimStatus", "IdempotencyStore", "InMemoryStore", "SQLiteStore"]


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


class InMemoryStore:
    """A store in this process's memory: for tests and single-process tools."""

    blocking = False

    def __init__(self) -> None:
        self._done: dict[str, int] = {}
        self._leases: dict[str, int] = {}
        self._lock = threading.Lock()

    def claim(self, key: str, *, lease_ms: int, now_ms: int) -> ClaimStatus:
        with self._lock:
            if key in self._done:
                return ClaimStatus.DONE
            if self._leases.get(key, -1) > now_ms:
                return ClaimStatus.BUSY
            self._leases[key] = now_ms + lease_ms
            return ClaimStatus.CLAIMED

    def complete(self, key: str, *, now_ms: int) -> None:
        with self._lock:
            self._leases.pop(key, None)
            self._done[key] = now_ms

    def release(self, key: str) -> None:
        with self._lock:
            self._leases.pop(key, None)

    def prune(self, *, older_than_ms: int) -> int:
        with self._lock:
            old = [k for k, at in self._done.items() if at < older_than_ms]
            for key in old:
                del self._done[key]
            expired = [k for k, until in self._leases.items() if until < older_than_ms]
            for key in expired:
                del self._leases[key]
            return len(old) + len(expired)

    def close(self) -> None:
        pass


_SCHEMA = """
CREATE TABLE IF NOT EXISTS delayq_idempotency (
    key          TEXT PRIMARY KEY,
    done_at      INTEGER,          -- epoch ms when completed, NULL while claimed
    lease_until  INTEGER NOT NULL  -- epoch ms when a claim expires
)
"""


class SQLiteStore:
    """A store in a SQLite file: the embedded default, safe for several processes on
    one host (WAL journal, ``BEGIN IMMEDIATE`` claims, a busy timeout)."""

    blocking = True

    def __init__(self, path: str | Path, *, busy_timeout_ms: int = 10_000) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(
            str(self.path),
            timeout=busy_timeout_ms / 1000,
            isolation_level=None,  # explicit transactions below
            check_same_thread=False,
        )
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(_SCHEMA)

    def __repr__(self) -> str:
        return f"SQLiteStore({str(self.path)!r})"

    def claim(self, key: str, *, lease_ms: int, now_ms: int) -> ClaimStatus:
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute(
                    "SELECT done_at, lease_until FROM delayq_idempotency WHERE key = ?", (key,)
                ).fetchone()
                if row is not None and row[0] is not None:
                    status = ClaimStatus.DONE
                elif row is not None and row[1] > now_ms:
                    status = ClaimStatus.BUSY
                else:
                    db.execute(
                        "INSERT INTO delayq_idempotency (key, done_at, lease_until) "
                        "VALUES (?, NULL, ?) ON CONFLICT(key) DO UPDATE SET "
                        "done_at = NULL, lease_until = excluded.lease_until",
                        (key, now_ms + lease_ms),
                    )
                    status = ClaimStatus.CLAIMED
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            return status

    def complete(self, key: str, *, now_ms: int) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO delayq_idempotency (key, done_at, lease_until) VALUES (?, ?, ?) "
                "ON CONFLICT(key) DO UPDATE SET done_at = excluded.done_at",
                (key, now_ms, now_ms),
            )

    def release(self, key: str) -> None:
        with self._lock:
            self._db.execute(
                "DELETE FROM delayq_idempotency WHERE key = ? AND done_at IS NULL", (key,)
            )

    def prune(self, *, older_than_ms: int) -> int:
        with self._lock:
            cursor = self._db.execute(
                "DELETE FROM delayq_idempotency WHERE (done_at IS NOT NULL AND done_at < ?) "
                "OR (done_at IS NULL AND lease_until < ?)",
                (older_than_ms, older_than_ms),
            )
            return cursor.rowcount

    def close(self) -> None:
        with self._lock:
            self._db.close()
