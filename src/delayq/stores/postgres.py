"""An idempotency store in PostgreSQL: shared by consumers on many hosts.

One table (created if missing) holds a row per key, the same shape as the SQLite
store's: ``done_at`` is NULL while the key is claimed and the epoch ms of completion
afterwards; ``lease_until`` is when a claim expires. A claim is one
``INSERT ... ON CONFLICT DO UPDATE ... WHERE ... RETURNING`` statement: PostgreSQL
locks the conflicting row and re-checks the condition on its newest version, so two
consumers (any processes, any hosts) never both win a key.

A cancelled or rescheduled key's row also holds ``generation`` (copies below it are
cancelled) and ``marked_at``; a cancel takes the row's lock like a claim does
(``INSERT ... ON CONFLICT``), so the two are atomic against each other.

>>> store = PostgresStore("postgresql://app@db/app")        # doctest: +SKIP
>>> store.claim("order-42", lease_ms=60_000, now_ms=now)    # doctest: +SKIP
<ClaimStatus.CLAIMED: 'claimed'>
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

try:
    import psycopg
    from psycopg import sql
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        "delayq.stores.postgres needs psycopg 3: pip install 'delayq[postgres]'"
    ) from exc

from delayq.errors import ClaimLost
from delayq.stores._postgres_dsn import redact_dsn, scrub_dsn
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

__all__ = ["PostgresStore", "redact_dsn", "table_identifier"]

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def table_identifier(table: str) -> sql.Identifier:
    """``table`` (``name`` or ``schema.name``) as a quoted SQL identifier; ``ValueError``
    for anything else."""
    parts = table.split(".")
    if len(parts) > 2 or not all(_IDENTIFIER.fullmatch(part) for part in parts):
        raise ValueError(
            f"table must be a plain SQL identifier or schema.identifier "
            f"(letters, digits, _), not {table!r}"
        )
    return sql.Identifier(*parts)


def _claim_status(cursor: psycopg.Cursor[Any]) -> ClaimStatus:
    row = cursor.fetchone()
    assert row is not None
    won, done, cancelled = row
    if won:
        return ClaimStatus.CLAIMED
    if cancelled:
        return ClaimStatus.CANCELLED
    return ClaimStatus.DONE if done else ClaimStatus.BUSY


def _cancel_status(op: Cancel, marked: Any, state: Any) -> CancelStatus:
    """What a cancel's INSERT returned (``(inserted,)`` when it marked the key) or, when
    it did not, the row as its lock holds it (``(done_at, lease_until, generation)``)."""
    if marked is not None:
        return CancelStatus.UNKNOWN if marked[0] else CancelStatus.CANCELLED
    done_at, lease_until, generation = state
    if done_at is not None:
        return CancelStatus.ALREADY_HANDLED
    if lease_until > op.now_ms:
        return CancelStatus.IN_PROGRESS
    if generation >= CANCELLED_GENERATION:
        return CancelStatus.ALREADY_CANCELLED
    return CancelStatus.OUTDATED


class PostgresStore:
    """An :class:`~delayq.stores.base.IdempotencyStore` in a PostgreSQL table.

    ``dsn`` is anything libpq takes (``postgresql://user:pass@host:5432/db`` or
    ``host=... dbname=...``); ``table`` may be schema-qualified. The store keeps one
    autocommit connection, used by one thread at a time; after the connection breaks,
    the failed call raises and the next one reconnects.
    """

    blocking = True

    def __init__(
        self,
        dsn: str,
        *,
        table: str = "delayq_idempotency",
        connect_timeout_s: float = 10.0,
    ) -> None:
        self._dsn = dsn
        self.table = table
        self._connect_timeout_s = connect_timeout_s
        ident = table_identifier(table)
        self._lock = threading.Lock()
        self._sql_create = sql.SQL(
            "CREATE TABLE IF NOT EXISTS {t} ("
            " key TEXT PRIMARY KEY,"
            " done_at BIGINT NULL,"
            " lease_until BIGINT NOT NULL,"
            " generation BIGINT NOT NULL DEFAULT 0,"
            " marked_at BIGINT NULL)"
        ).format(t=ident)
        # A table made by an older delayq gets the cancellation columns.
        self._sql_migrate = sql.SQL(
            "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS generation BIGINT NOT NULL DEFAULT 0,"
            " ADD COLUMN IF NOT EXISTS marked_at BIGINT NULL"
        ).format(t=ident)
        # The claim and, from the statement's snapshot, whether a key it could not
        # claim is cancelled or done (else busy; a row completed or cancelled by a
        # racing client reads busy: the copy is deferred, and meets it next time).
        self._sql_claim = sql.SQL(
            "WITH won AS ("
            " INSERT INTO {t} AS cur (key, done_at, lease_until)"
            " VALUES (%(key)s, NULL, %(until)s)"
            " ON CONFLICT (key) DO UPDATE SET done_at = NULL, lease_until = EXCLUDED.lease_until"
            " WHERE cur.done_at IS NULL AND cur.lease_until <= %(now)s"
            " AND cur.generation <= %(gen)s"
            " RETURNING 1)"
            " SELECT EXISTS (SELECT 1 FROM won), was.done_at IS NOT NULL,"
            " was.generation > %(gen)s"
            " FROM (SELECT 1) AS one LEFT JOIN {t} AS was ON was.key = %(key)s"
        ).format(t=ident)
        # A cancel marks the key unless it is done, under a live claim, or already marked
        # at or above its generation; ON CONFLICT locks the row either way (to the end of
        # the batch's transaction), so the SELECT after it reads what kept it unmarked.
        self._sql_cancel = sql.SQL(
            "INSERT INTO {t} AS cur (key, done_at, lease_until, generation, marked_at)"
            " VALUES (%(key)s, NULL, 0, %(gen)s, %(now)s)"
            " ON CONFLICT (key) DO UPDATE SET lease_until = 0,"
            " generation = EXCLUDED.generation, marked_at = EXCLUDED.marked_at"
            " WHERE cur.done_at IS NULL AND cur.lease_until <= %(now)s"
            " AND cur.generation < %(gen)s"
            " RETURNING xmax = 0"
        ).format(t=ident)
        self._sql_cancel_state = sql.SQL(
            "SELECT done_at, lease_until, generation FROM {t} WHERE key = %s"
        ).format(t=ident)
        # An uncancel removes the row of a cancelled key (not done): the DELETE locks it,
        # the SELECT after it reads what any other key is (see delayq.stores.uncancel).
        self._sql_uncancel = sql.SQL(
            "DELETE FROM {t} WHERE key = %s AND done_at IS NULL AND generation >= %s RETURNING 1"
        ).format(t=ident)
        self._sql_complete = sql.SQL(
            "INSERT INTO {t} (key, done_at, lease_until) VALUES (%s, %s, %s)"
            " ON CONFLICT (key) DO UPDATE SET done_at = EXCLUDED.done_at"
        ).format(t=ident)
        # A cancelled or rescheduled key keeps its mark.
        self._sql_release = sql.SQL(
            "WITH kept AS (UPDATE {t} SET lease_until = 0"
            " WHERE key = %(key)s AND done_at IS NULL AND marked_at IS NOT NULL RETURNING 1)"
            " DELETE FROM {t} WHERE key = %(key)s AND done_at IS NULL AND marked_at IS NULL"
        ).format(t=ident)
        self._sql_finish = sql.SQL(
            "UPDATE {t} SET done_at = %s WHERE key = %s AND done_at IS NULL AND lease_until = %s"
        ).format(t=ident)
        self._sql_done_page = sql.SQL(
            "SELECT key, done_at FROM {t} WHERE done_at IS NOT NULL AND key > %s"
            " ORDER BY key LIMIT 500"
        ).format(t=ident)
        self._sql_prune = sql.SQL(
            "DELETE FROM {t} WHERE ((done_at IS NOT NULL AND done_at < %(cut)s)"
            " OR (done_at IS NULL AND lease_until < %(cut)s))"
            " AND COALESCE(marked_at, -1) < %(cut)s"
        ).format(t=ident)
        self._conn: psycopg.Connection[Any] | None = None
        self._idle: list[psycopg.Connection[Any]] = []
        """Connections for handlers' transactions, kept for the next one."""
        self._closed = False
        with self._lock:
            conn = self._connection()
            # Several processes may start at once: serialise the CREATE TABLE IF NOT
            # EXISTS (it is not safe against itself) on an advisory lock.
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"delayq:{table}",))
                conn.execute(self._sql_create)
                # Only when missing: ALTER TABLE locks out running consumers' claims.
                marks = conn.execute(
                    "SELECT count(*) FROM pg_attribute WHERE attrelid = %s::regclass"
                    " AND attname IN ('generation', 'marked_at') AND NOT attisdropped",
                    (ident.as_string(conn),),
                ).fetchone()
                if marks is None or marks[0] != 2:
                    conn.execute(self._sql_migrate)

    def __repr__(self) -> str:
        return f"PostgresStore({redact_dsn(self._dsn)!r}, table={self.table!r})"

    def _connection(self) -> psycopg.Connection[Any]:
        if self._closed:
            raise closed_error(self)
        conn = self._conn
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        if conn is not None:
            conn.close()
        self._conn = conn = self._connect()
        return conn

    def _connect(self) -> psycopg.Connection[Any]:
        if self._closed:
            raise psycopg.InterfaceError(f"{self!r} is closed")
        try:
            return psycopg.connect(
                self._dsn,
                autocommit=True,
                connect_timeout=max(1, round(self._connect_timeout_s)),
            )
        except psycopg.Error as exc:
            message = scrub_dsn(str(exc).strip(), self._dsn)
            raise type(exc)(
                f"cannot connect to PostgreSQL at {redact_dsn(self._dsn)}: {message}"
            ) from None

    def claim(self, key: str, *, lease_ms: int, now_ms: int, generation: int = 0) -> ClaimStatus:
        with self._lock:
            cursor = self._execute(self._connection(), Claim(key, lease_ms, now_ms, generation))
            return _claim_status(cursor)

    def cancel(
        self, key: str, *, now_ms: int, generation: int = CANCELLED_GENERATION
    ) -> CancelStatus:
        return self.cancel_batch([Cancel(key, now_ms, generation)])[0]

    def cancel_batch(self, ops: Sequence[Cancel]) -> list[CancelStatus]:
        """``ops`` in one transaction, pipelined (one round trip). Rows are locked in key
        order, so two batches over the same keys wait for each other, never deadlock."""
        for op in ops:
            check_cancel(op)
        order = sorted(range(len(ops)), key=lambda i: ops[i].key)
        results: list[CancelStatus | None] = [None] * len(ops)
        with self._lock:
            conn = self._connection()
            with conn.transaction(), conn.pipeline():
                pending = []
                for index in order:
                    op = ops[index]
                    params = {
                        "key": op.key,
                        "gen": op.generation,
                        "now": int(op.now_ms),
                    }
                    marked = conn.execute(self._sql_cancel, params)
                    state = conn.execute(self._sql_cancel_state, (op.key,))
                    pending.append((index, op, marked, state))
            for index, op, marked, state in pending:
                results[index] = _cancel_status(op, marked.fetchone(), state.fetchone())
        return [status for status in results if status is not None]

    def uncancel_batch(
        self, keys: Sequence[str], *, now_ms: int, look_only: bool = False
    ) -> list[UncancelStatus]:
        """Remove cancels' marks in one transaction, pipelined, rows in key order (see
        :mod:`delayq.stores.uncancel`); ``look_only``: remove nothing."""
        check_uncancel(keys, now_ms)
        with self._lock:
            conn = self._connection()
            with conn.transaction(), conn.pipeline():
                pending = {}
                for key in sorted(set(keys)):
                    gone = (
                        None
                        if look_only
                        else conn.execute(self._sql_uncancel, (key, CANCELLED_GENERATION))
                    )
                    pending[key] = (gone, conn.execute(self._sql_cancel_state, (key,)))
            found = {}
            for key, (gone, state) in pending.items():
                row = state.fetchone()
                if gone is not None and gone.fetchone() is not None:
                    found[key] = UncancelStatus.UNCANCELLED
                elif row is None:
                    found[key] = UncancelStatus.NOT_CANCELLED
                else:
                    found[key] = uncancel_status(*row, now_ms=now_ms, look_only=True)
        return [found[key] for key in keys]

    def complete(self, key: str, *, now_ms: int) -> None:
        with self._lock:
            self._execute(self._connection(), Complete(key, now_ms))

    def release(self, key: str) -> None:
        with self._lock:
            self._execute(self._connection(), Release(key))

    def run_batch(self, ops: Sequence[StoreOp]) -> list[ClaimStatus | None]:
        """``ops`` in one pipeline (one round trip), each statement its own transaction."""
        with self._lock:
            conn = self._connection()
            with conn.pipeline():
                cursors = [self._execute(conn, op) for op in ops]
            return [
                _claim_status(cursor) if isinstance(op, Claim) else None
                for op, cursor in zip(ops, cursors, strict=True)
            ]

    def _execute(self, conn: psycopg.Connection[Any], op: StoreOp) -> psycopg.Cursor[Any]:
        if isinstance(op, Claim):
            params = {
                "key": op.key,
                "until": op.lease_until_ms,
                "now": int(op.now_ms),
                "gen": int(op.generation),
            }
            return conn.execute(self._sql_claim, params)
        if isinstance(op, Complete):
            return conn.execute(self._sql_complete, (op.key, int(op.now_ms), int(op.now_ms)))
        return conn.execute(self._sql_release, {"key": op.key})

    @contextmanager
    def transaction(self, key: str, *, lease_until_ms: int, now_ms: int) -> Iterator[Any]:
        """A transaction on a connection of its own (kept for the next one); see
        :class:`~delayq.stores.base.TransactionalStore`. The final ``UPDATE`` locks the
        key's row, so a consumer claiming it after an expiry waits for this commit."""
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None or conn.closed or conn.broken:
            conn = self._connect()
        try:
            with conn.transaction():
                yield conn
                finished = conn.execute(self._sql_finish, (now_ms, key, lease_until_ms))
                if finished.rowcount != 1:
                    raise ClaimLost(
                        f"the claim on key {key!r} was lost before the handler's transaction "
                        "could commit; its writes were rolled back"
                    )
        finally:
            with self._lock:
                if self._closed or conn.closed or conn.broken:
                    conn.close()
                else:
                    self._idle.append(conn)

    def done_keys(self) -> Iterator[tuple[str, int]]:
        """Every completed key and when, a page at a time (by key order)."""
        after = ""
        while True:
            with self._lock:
                page = self._connection().execute(self._sql_done_page, (after,)).fetchall()
            if not page:
                return
            for key, done_at in page:
                yield str(key), int(done_at)
            after = page[-1][0]

    def prune(self, *, older_than_ms: int) -> int:
        with self._lock:
            cursor = self._connection().execute(self._sql_prune, {"cut": int(older_than_ms)})
            return cursor.rowcount

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for conn in [self._conn, *self._idle]:
                if conn is not None:
                    conn.close()
            self._conn = None
            self._idle.clear()
