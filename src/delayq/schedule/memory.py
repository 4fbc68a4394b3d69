"""The schedule index in this process's memory: for tests and one-process tools."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from delayq.errors import StoreError
from delayq.schedule.base import check_limit, check_move, check_new, replaces
from delayq.schedule.entry import FINISHED, Entry, State, moves
from delayq.schedule.query import Cursor, Query, page_key

__all__ = ["MemorySchedule"]


class MemorySchedule:
    """A :class:`delayq.schedule.base.ScheduleStore` in a dict, under one lock."""

    blocking = False

    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}
        self._lock = threading.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"MemorySchedule(entries={len(self._entries)})"

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the schedule index was closed")

    def add(self, entries: Sequence[Entry]) -> list[bool]:
        check_new(entries)
        with self._lock:
            self._check_open()
            added = []
            for entry in entries:
                old = self._entries.get(entry.id)
                fits = old is None or replaces(old.state, old.namespace, entry.namespace)
                if fits:
                    self._entries[entry.id] = entry
                added.append(fits)
            return added

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
        changes: dict[str, object] = {}
        if due_at_ms is not None:
            changes["due_at_ms"] = due_at_ms
        if generation is not None:
            changes["generation"] = generation
        if tier is not None:
            changes["tier"] = tier
        with self._lock:
            self._check_open()
            after: list[State | None] = []
            for entry_id in ids:
                entry = self._entries.get(entry_id)
                if entry is None:
                    after.append(None)
                elif moves(entry.state, to):
                    self._entries[entry_id] = entry.moved(to, now_ms, **changes)
                    after.append(to)
                else:
                    after.append(entry.state)
            return after

    def get(self, entry_id: str) -> Entry | None:
        with self._lock:
            self._check_open()
            return self._entries.get(entry_id)

    def find(self, query: Query, *, after: Cursor | None = None, limit: int = 100) -> list[Entry]:
        check_limit(limit)
        with self._lock:
            self._check_open()
            found = [
                e
                for e in self._entries.values()
                if query.matches(e) and (after is None or page_key(e) > after)
            ]
        found.sort(key=page_key)
        return found[:limit]

    def count(self, query: Query) -> int:
        with self._lock:
            self._check_open()
            return sum(1 for e in self._entries.values() if query.matches(e))

    def tiers(self, query: Query) -> dict[str, int]:
        found: dict[str, int] = {}
        with self._lock:
            self._check_open()
            for e in self._entries.values():
                if query.matches(e):
                    found[e.tier] = found.get(e.tier, 0) + 1
        return found

    def expire(self, *, finished_before_ms: int) -> int:
        with self._lock:
            self._check_open()
            gone = [
                e.id
                for e in self._entries.values()
                if e.state in FINISHED and e.changed_at_ms < finished_before_ms
            ]
            for entry_id in gone:
                del self._entries[entry_id]
            return len(gone)

    def close(self) -> None:
        with self._lock:
            self._closed = True
