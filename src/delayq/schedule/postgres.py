"""The schedule index in PostgreSQL: shared by publishers and consumers on many hosts.

One row an entry, the SQLite index's shape (``destinations`` an array, ``labels`` and
``headers`` JSONB); an index on ``(state, due_at_ms, id)`` for the waiting view and its
pages, one on ``business_key``, a GIN index on ``labels``. Every move is one ``UPDATE ...
WHERE state = ANY(...)``: PostgreSQL re-checks the condition on the row's newest version
under its lock, so two processes never move an entry from a state it has left.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

try:
    import psycopg
    from psycopg import sql
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        "delayq.schedule.postgres needs psycopg 3: pip install 'delayq[postgres]'"
    ) from exc

from delayq.errors import InvalidInput, StoreError
from delayq.schedule.base import REPLACEABLE, check_limit, check_move, check_new
from delayq.schedule.entry import FIELDS, FINISHED, Entry, Restore, State, allowed_from
from delayq.schedule.query import Cursor, Query, topic_regex
from delayq.stores._postgres_dsn import redact_dsn, scrub_dsn
from delayq.stores.postgres import table_identifier

__all__ = ["PostgresSchedule"]

_COLUMNS = ", ".join(FIELDS)  # in the order Restore reads a row


def _row(entry: Entry) -> tuple[Any, ...]:
    """``entry``'s values in :data:`~delayq.schedule.entry.FIELDS` order."""
    return (
        entry.id, entry.namespace, entry.routing_key, entry.due_at_ms, entry.tier,
        entry.published_at_ms, entry.size, list(entry.destinations), entry.business_key,
        json.dumps(dict(entry.labels)), entry.state.value, entry.generation,
        entry.changed_at_ms, entry.body, entry.content_type,
        None if entry.headers is None else json.dumps(dict(entry.headers)), entry.delay_ms,
    )  # fmt: skip


_TYPES = ("text", "text", "text", "bigint", "text", "bigint", "bigint", "text", "text", "text",
          "text", "bigint", "bigint", "bytea", "text", "text", "bigint")  # fmt: skip
_UPSERT = (
    "INSERT INTO {t} AS cur (" + _COLUMNS + ") SELECT u.id, u.namespace, u.routing_key,"
    " u.due_at_ms, u.tier, u.published_at_ms, u.size,"
    " ARRAY(SELECT jsonb_array_elements_text(u.destinations::jsonb)), u.business_key,"
    " u.labels::jsonb, u.state, u.generation, u.changed_at_ms, u.body, u.content_type,"
    " u.headers::jsonb, u.delay_ms FROM unnest("
    + ", ".join(f"%s::{kind}[]" for kind in _TYPES)
    + ") AS u("
    + _COLUMNS
    + ") ON CONFLICT (id) DO UPDATE SET {u}"
    " WHERE cur.state = ANY(%s)"
    " AND NOT (cur.state = 'cancelled' AND cur.namespace = EXCLUDED.namespace)"  # replaces
    " RETURNING id"
)
_UPSERT_SET = sql.SQL(", ").join(
    sql.SQL("{c} = EXCLUDED.{c}").format(c=sql.Identifier(c)) for c in FIELDS[1:]
)


def _where(query: Query) -> tuple[sql.Composable, list[Any]]:
    clauses: list[sql.Composable] = [sql.SQL("state = ANY(%s)")]
    args: list[Any] = [sorted(s.value for s in query.states)]
    for column, value in (("namespace", query.namespace), ("business_key", query.business_key)):
        if value is not None:
            clauses.append(sql.SQL("{} = %s").format(sql.Identifier(column)))
            args.append(value)
    if query.due_after_ms is not None:
        clauses.append(sql.SQL("due_at_ms >= %s"))
        args.append(query.due_after_ms)
    if query.due_before_ms is not None:
        clauses.append(sql.SQL("due_at_ms < %s"))
        args.append(query.due_before_ms)
    if query.ids is not None:
        clauses.append(sql.SQL("id = ANY(%s)"))
        args.append(sorted(query.ids))
    if query.destination is not None:
        clauses.append(sql.SQL("%s = ANY(destinations)"))
        args.append(query.destination)
    if query.labels:
        clauses.append(sql.SQL("labels @> %s::jsonb"))
        args.append(json.dumps(dict(query.labels)))
    if query.routing_key is not None:
        clauses.append(
            sql.SQL("(CASE WHEN routing_key = '' THEN '' ELSE '.' || routing_key END) ~ %s")
        )
        args.append(topic_regex(query.routing_key))
    return sql.SQL(" AND ").join(clauses), args


class PostgresSchedule:
    """A :class:`delayq.schedule.base.ScheduleStore` in a PostgreSQL table (created if
    missing). One autocommit connection, used by one thread at a time; after it breaks,
    the failed call raises :class:`~delayq.errors.StoreError` and the next reconnects."""

    blocking = True

    def __init__(
        self, dsn: str, *, table: str = "delayq_schedule", connect_timeout_s: float = 10.0
    ) -> None:
        try:
            self._t = table_identifier(table)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        self._dsn = dsn
        self.table = table
        self._connect_timeout_s = connect_timeout_s
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._closed = False
        index = table.replace(".", "_")
        with self._session() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"delayq:{table}",))
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {t} (id TEXT PRIMARY KEY, namespace TEXT NOT NULL,"
                    " routing_key TEXT NOT NULL, destinations TEXT[] NOT NULL,"
                    " due_at_ms BIGINT NOT NULL, tier TEXT NOT NULL,"
                    " published_at_ms BIGINT NOT NULL, size BIGINT NOT NULL, business_key TEXT,"
                    " labels JSONB NOT NULL, state TEXT NOT NULL, generation BIGINT NOT NULL,"
                    " changed_at_ms BIGINT NOT NULL, body BYTEA, content_type TEXT,"
                    " headers JSONB, delay_ms BIGINT)"
                ).format(t=self._t)
            )
            conn.execute(  # a table an older delayq made
                sql.SQL("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS delay_ms BIGINT").format(
                    t=self._t
                )
            )
            for name, how in (
                ("due", "(state, due_at_ms, id)"),
                ("key", "(business_key)"),
                ("labels", "USING GIN (labels jsonb_path_ops)"),
            ):
                conn.execute(
                    sql.SQL("CREATE INDEX IF NOT EXISTS {i} ON {t} " + how).format(
                        i=sql.Identifier(f"{index}_{name}"), t=self._t
                    )
                )

    def __repr__(self) -> str:
        return f"PostgresSchedule({redact_dsn(self._dsn)!r}, table={self.table!r})"

    @contextmanager
    def _session(self) -> Iterator[psycopg.Connection[Any]]:
        """The connection, under the lock; a client error as a ``StoreError``."""
        with self._lock:
            if self._closed:
                raise StoreError(f"{self!r} was closed")
            try:
                conn = self._conn
                if conn is None or conn.closed or conn.broken:
                    if conn is not None:
                        conn.close()
                    self._conn = conn = psycopg.connect(
                        self._dsn,
                        autocommit=True,
                        connect_timeout=max(1, round(self._connect_timeout_s)),
                    )
                yield conn
            except psycopg.Error as exc:
                message = scrub_dsn(str(exc).strip(), self._dsn)
                raise StoreError(f"{self!r}: {type(exc).__name__}: {message}") from None

    def add(self, entries: Sequence[Entry]) -> list[bool]:
        check_new(entries)
        if not entries:
            return []
        # One statement for the batch: the rows as arrays (unnest), upserted; the ids it
        # returns went in, the others are live entries it kept.
        columns = list(zip(*(_row(e) for e in entries), strict=True))
        columns[7] = tuple(json.dumps(list(e.destinations)) for e in entries)
        replaceable = sorted(s.value for s in REPLACEABLE)
        with self._session() as conn, conn.transaction():
            added = {
                row[0]
                for row in conn.execute(
                    sql.SQL(_UPSERT).format(t=self._t, u=_UPSERT_SET),
                    (*(list(c) for c in columns), replaceable),
                )
            }
        return [e.id in added for e in entries]

    def move(
        self,
        ids: Sequence[str],
        to: State,
        *,
        now_ms: int,
        due_at_ms: int | None = None,
        generation: int | None = None,
        tier: str | None = None,
    ) -> list[State | None]:
        check_move(to, tier, now_ms=now_ms, due_at_ms=due_at_ms, generation=generation)
        allowed = sorted(s.value for s in allowed_from(to))
        if not allowed:
            raise InvalidInput(f"no entry moves to {to.value}: entries are added pending")
        listed = list(ids)
        with self._session() as conn, conn.transaction():
            moved = {
                row[0]
                for row in conn.execute(
                    sql.SQL(
                        "UPDATE {t} SET state = %s, changed_at_ms = %s,"
                        " due_at_ms = COALESCE(%s, due_at_ms),"
                        " generation = COALESCE(%s, generation), tier = COALESCE(%s, tier)"
                        " WHERE id = ANY(%s) AND state = ANY(%s) RETURNING id"
                    ).format(t=self._t),
                    (to.value, now_ms, due_at_ms, generation, tier, listed, allowed),
                )
            }
            if len(moved) == len(ids):
                return [to] * len(ids)
            held = dict(
                conn.execute(
                    sql.SQL("SELECT id, state FROM {t} WHERE id = ANY(%s)").format(t=self._t),
                    (listed,),
                ).fetchall()
            )
        return [to if i in moved else (State(held[i]) if i in held else None) for i in ids]

    def get(self, entry_id: str) -> Entry | None:
        with self._session() as conn:
            row = conn.execute(
                sql.SQL("SELECT " + _COLUMNS + " FROM {t} WHERE id = %s").format(t=self._t),
                (entry_id,),
            ).fetchone()
        return None if row is None else Restore()(row)

    def find(self, query: Query, *, after: Cursor | None = None, limit: int = 100) -> list[Entry]:
        check_limit(limit)
        where, args = _where(query)
        if after is not None:
            where = sql.SQL("{} AND (due_at_ms, id) > (%s, %s)").format(where)
            args += list(after)
        with self._session() as conn:
            rows = conn.execute(
                sql.SQL(
                    "SELECT " + _COLUMNS + " FROM {t} WHERE {w} ORDER BY due_at_ms, id LIMIT %s"
                ).format(t=self._t, w=where),
                (*args, limit),
            ).fetchall()
        restore = Restore()
        return [restore(row) for row in rows]

    def count(self, query: Query) -> int:
        where, args = _where(query)
        with self._session() as conn:
            row = conn.execute(
                sql.SQL("SELECT count(*) FROM {t} WHERE {w}").format(t=self._t, w=where), args
            ).fetchone()
        return 0 if row is None else int(row[0])

    def tiers(self, query: Query) -> dict[str, int]:
        where, args = _where(query)
        with self._session() as conn:
            rows = conn.execute(
                sql.SQL("SELECT tier, count(*) FROM {t} WHERE {w} GROUP BY tier").format(
                    t=self._t, w=where
                ),
                args,
            ).fetchall()
        return {tier: int(n) for tier, n in rows}

    def expire(self, *, finished_before_ms: int) -> int:
        with self._session() as conn:
            cursor = conn.execute(
                sql.SQL("DELETE FROM {t} WHERE state = ANY(%s) AND changed_at_ms < %s").format(
                    t=self._t
                ),
                (sorted(s.value for s in FINISHED), finished_before_ms),
            )
            return cursor.rowcount

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None
