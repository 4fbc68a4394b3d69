"""The schedule index in a SQLite file: one host, any number of processes (WAL journal,
``BEGIN IMMEDIATE`` writes). One row an entry; an index on ``(state, due_at_ms, id)``
answers the waiting view, its counts and its pages in due order."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from delayq.errors import InvalidInput, StoreError
from delayq.schedule.base import REPLACEABLE, JsonTexts, check_limit, check_move, check_new
from delayq.schedule.entry import FIELDS, FINISHED, Entry, Restore, State, allowed_from
from delayq.schedule.query import Cursor, Query
from delayq.stores.sqlite import immediate
from delayq.topology.topic import topic_matches

__all__ = ["SQLiteSchedule"]

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS delayq_schedule (
    id              TEXT PRIMARY KEY,
    namespace       TEXT NOT NULL,
    routing_key     TEXT NOT NULL,
    destinations    TEXT NOT NULL,      -- a JSON array
    due_at_ms       INTEGER NOT NULL,
    tier            TEXT NOT NULL,
    published_at_ms INTEGER NOT NULL,
    size            INTEGER NOT NULL,
    business_key    TEXT,
    labels          TEXT NOT NULL,      -- a JSON object
    state           TEXT NOT NULL,
    generation      INTEGER NOT NULL,
    changed_at_ms   INTEGER NOT NULL,
    body            BLOB,
    content_type    TEXT,
    headers         TEXT,               -- a JSON object, kept with the body
    delay_ms        INTEGER             -- the delay asked for; NULL: not known
)""",
    "CREATE INDEX IF NOT EXISTS delayq_schedule_due ON delayq_schedule(state, due_at_ms, id)",
    "CREATE INDEX IF NOT EXISTS delayq_schedule_key ON delayq_schedule(business_key) "
    "WHERE business_key IS NOT NULL",
)

_COLUMNS = ", ".join(FIELDS)  # in the order Restore reads a row

_UPDATES = ", ".join(f"{c} = excluded.{c}" for c in _COLUMNS.split(", ")[1:])
_ADD = (
    f"INSERT INTO delayq_schedule ({_COLUMNS}) VALUES ({', '.join('?' * len(FIELDS))}) "
    f"ON CONFLICT(id) DO UPDATE SET {_UPDATES} "
    f"WHERE delayq_schedule.state IN ({', '.join(repr(s.value) for s in sorted(REPLACEABLE))}) "
    "AND NOT (delayq_schedule.state = 'cancelled' "
    "AND delayq_schedule.namespace = excluded.namespace)"  # base.replaces
)


def _row(entry: Entry, texts: JsonTexts) -> tuple[Any, ...]:
    """``entry``'s values in :data:`~delayq.schedule.entry.FIELDS` order."""
    return (
        entry.id, entry.namespace, entry.routing_key, entry.due_at_ms, entry.tier,
        entry.published_at_ms, entry.size, texts(entry.destinations), entry.business_key,
        texts(entry.labels), entry.state.value, entry.generation,
        entry.changed_at_ms, entry.body, entry.content_type,
        None if entry.headers is None else json.dumps(dict(entry.headers)), entry.delay_ms,
    )  # fmt: skip


def _where(query: Query) -> tuple[str, list[Any]]:
    states = sorted(s.value for s in query.states)
    # Found by id or business key where the query names them (``+state``: not through
    # the state index, which would walk every entry in those states).
    by_key = query.ids is not None or query.business_key is not None
    clauses = [f"{'+' if by_key else ''}state IN ({', '.join('?' * len(states))})"]
    args: list[Any] = list(states)
    for column, value in (("namespace", query.namespace), ("business_key", query.business_key)):
        if value is not None:
            clauses.append(f"{column} = ?")
            args.append(value)
    if query.due_after_ms is not None:
        clauses.append("due_at_ms >= ?")
        args.append(query.due_after_ms)
    if query.due_before_ms is not None:
        clauses.append("due_at_ms < ?")
        args.append(query.due_before_ms)
    if query.ids is not None:
        clauses.append("id IN (SELECT value FROM json_each(?))")
        args.append(json.dumps(sorted(query.ids)))
    if query.destination is not None:
        clauses.append("EXISTS (SELECT 1 FROM json_each(destinations) WHERE value = ?)")
        args.append(query.destination)
    for key, value in query.labels.items():
        clauses.append("EXISTS (SELECT 1 FROM json_each(labels) WHERE key = ? AND value = ?)")
        args += [key, value]
    if query.routing_key is not None:
        clauses.append("delayq_topic(?, routing_key)")
        args.append(query.routing_key)
    return " AND ".join(clauses), args


class SQLiteSchedule:
    """A :class:`delayq.schedule.base.ScheduleStore` in a SQLite file."""

    blocking = True

    def __init__(self, path: str | Path, *, busy_timeout_ms: int = 10_000) -> None:
        if not isinstance(path, (str, Path)) or not str(path) or str(path) == ":memory:":
            raise InvalidInput(
                f"SQLiteSchedule needs a file path, not {path!r} (in memory: MemorySchedule())"
            )
        if isinstance(busy_timeout_ms, bool) or not isinstance(busy_timeout_ms, int):
            raise InvalidInput(
                f"busy_timeout_ms is an int of milliseconds, not {busy_timeout_ms!r}"
            )
        self.path = Path(path)
        self._lock = threading.Lock()
        self._texts = JsonTexts()
        self._closed = False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(
                str(self.path),
                timeout=busy_timeout_ms / 1000,
                isolation_level=None,
                check_same_thread=False,
            )
            self._db.create_function("delayq_topic", 2, topic_matches, deterministic=True)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            with self._writing() as db:
                for statement in _SCHEMA:
                    db.execute(statement)
                columns = {row[1] for row in db.execute("PRAGMA table_info(delayq_schedule)")}
                if "delay_ms" not in columns:  # an index an older delayq made
                    db.execute("ALTER TABLE delayq_schedule ADD COLUMN delay_ms INTEGER")
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(
                f"cannot open the schedule index at {str(self.path)!r}: {type(exc).__name__}: {exc}"
            ) from exc

    def __repr__(self) -> str:
        return f"SQLiteSchedule({str(self.path)!r})"

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._closed:
                raise StoreError(f"{self!r} was closed")
            try:
                yield self._db
            except sqlite3.Error as exc:
                raise StoreError(f"{self!r}: {type(exc).__name__}: {exc}") from exc

    @contextmanager
    def _writing(self) -> Iterator[sqlite3.Connection]:
        with self._reading() as db, immediate(db):
            yield db

    def add(self, entries: Sequence[Entry]) -> list[bool]:
        check_new(entries)
        rows = [_row(e, self._texts) for e in entries]
        with self._writing() as db:
            # Usually no id is there yet: one many-row upsert, and a look for the ids
            # kept (a live entry of the same id) only when some row did not go in.
            before = db.total_changes
            db.executemany(_ADD, rows)
            if db.total_changes - before == len(rows):
                return [True] * len(rows)
            kept = {  # every row written is pending: one in another state was kept
                i
                for i, state in db.execute(
                    "SELECT id, state FROM delayq_schedule "
                    "WHERE id IN (SELECT value FROM json_each(?))",
                    (json.dumps([e.id for e in entries]),),
                )
                if state != State.PENDING.value
            }
        return [e.id not in kept for e in entries]

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
        listed = json.dumps(list(ids))
        with self._writing() as db:
            moved = {
                row[0]
                for row in db.execute(
                    "UPDATE delayq_schedule SET state = ?, changed_at_ms = ?, "
                    "due_at_ms = COALESCE(?, due_at_ms), generation = COALESCE(?, generation), "
                    "tier = COALESCE(?, tier) "
                    "WHERE id IN (SELECT value FROM json_each(?)) "
                    # ``+state``: found by id (the primary key), never by scanning the
                    # state index (every scheduled entry of a large index: issue 51)
                    f"AND +state IN ({', '.join('?' * len(allowed))}) RETURNING id",
                    (to.value, now_ms, due_at_ms, generation, tier, listed, *allowed),
                )
            }
            if len(moved) == len(ids):
                return [to] * len(ids)
            held = dict(
                db.execute(
                    "SELECT id, state FROM delayq_schedule "
                    "WHERE id IN (SELECT value FROM json_each(?))",
                    (listed,),
                ).fetchall()
            )
        return [to if i in moved else (State(held[i]) if i in held else None) for i in ids]

    def get(self, entry_id: str) -> Entry | None:
        with self._reading() as db:
            row = db.execute(
                f"SELECT {_COLUMNS} FROM delayq_schedule WHERE id = ?", (entry_id,)
            ).fetchone()
        return None if row is None else Restore()(row)

    def find(self, query: Query, *, after: Cursor | None = None, limit: int = 100) -> list[Entry]:
        check_limit(limit)
        where, args = _where(query)
        if after is not None:
            where += " AND (due_at_ms, id) > (?, ?)"
            args += list(after)
        with self._reading() as db:
            rows = db.execute(
                f"SELECT {_COLUMNS} FROM delayq_schedule WHERE {where} "
                "ORDER BY due_at_ms, id LIMIT ?",
                (*args, limit),
            ).fetchall()
        restore = Restore()
        return [restore(row) for row in rows]

    def count(self, query: Query) -> int:
        where, args = _where(query)
        with self._reading() as db:
            return int(
                db.execute(f"SELECT count(*) FROM delayq_schedule WHERE {where}", args).fetchone()[
                    0
                ]
            )

    def tiers(self, query: Query) -> dict[str, int]:
        where, args = _where(query)
        with self._reading() as db:
            rows = db.execute(
                f"SELECT tier, count(*) FROM delayq_schedule WHERE {where} GROUP BY tier", args
            ).fetchall()
        return {tier: int(n) for tier, n in rows}

    def expire(self, *, finished_before_ms: int) -> int:
        states = sorted(s.value for s in FINISHED)
        with self._writing() as db:
            return db.execute(
                f"DELETE FROM delayq_schedule WHERE state IN ({', '.join('?' * len(states))}) "
                "AND changed_at_ms < ?",
                (*states, finished_before_ms),
            ).rowcount

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._db.close()
