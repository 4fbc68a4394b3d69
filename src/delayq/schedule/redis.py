"""The schedule index in Redis: many processes on many hosts, one Redis server (not
Redis Cluster: a move touches keys of several slots).

Under ``prefix``:

* ``e:<id>``: a hash, the entry's fields (absent ones not stored);
* ``s:<namespace>:<state>``: a sorted set of the entries in that state, every score 0
  and each member ``<due_at_ms, 15 digits>:<id>``, so the members sort in page order
  (due time, then id) and a due window or a cursor is a ``ZRANGEBYLEX`` bound;
* ``f:<namespace>``: the finished entries, scored by when they last changed (``expire``);
* ``c:<namespace>:<state>``: a hash of how many entries each tier holds in that state;
* ``k:<business key>``: a set of the ids of that key; ``namespaces``: a set of them.

Every ``add`` and ``move`` is one Lua script over its batch, so a move is applied only
from the states :func:`~delayq.schedule.entry.allowed_from` allows, atomically against
the entry's state at that moment. Counts of a state, a namespace and a due window are
``ZLEXCOUNT``s; pages read the due-ordered sets and filter the rest (labels, routing
key, destination) on the entries read, so a filter of those over a wide window reads
every entry in it: narrow it with a due window.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

try:
    import redis
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        "delayq.schedule.redis needs the redis package: pip install 'delayq[redis]'"
    ) from exc

from delayq.errors import InvalidInput, StoreError
from delayq.schedule.base import JsonTexts, check_limit, check_move, check_new
from delayq.schedule.entry import FIELDS, Entry, Restore, State, allowed_from
from delayq.schedule.query import Cursor, Query
from delayq.schedule.redis_scripts import ADD, EXPIRE, MOVE
from delayq.urls import redact

__all__ = ["RedisSchedule"]

_PAGE = 500
"""Members a page read takes from each sorted set."""

_INTS = {"due_at_ms", "published_at_ms", "size", "generation", "changed_at_ms", "delay_ms"}


def _member(due_at_ms: int, entry_id: str) -> str:
    return f"{due_at_ms:015d}:{entry_id}"


class RedisSchedule:
    """A :class:`delayq.schedule.base.ScheduleStore` in Redis (``redis://``,
    ``rediss://``, ``unix://``), its keys under ``prefix``."""

    blocking = True

    def __init__(self, url: str, *, prefix: str = "delayq:schedule:") -> None:
        if not isinstance(url, str) or not isinstance(prefix, str) or not prefix:
            raise InvalidInput(f"RedisSchedule needs a Redis URL and a prefix, not {url!r}")
        self.prefix = prefix
        self._where = redact(url)
        self._texts = JsonTexts()
        self._closed = False
        try:
            self._client = redis.Redis.from_url(url)
        except ValueError as exc:
            raise InvalidInput(f"bad Redis URL {self._where}: {exc}") from None
        with self._calling():
            self._client.ping()
            self._add = self._client.register_script(ADD)
            self._move = self._client.register_script(MOVE)
            self._expire = self._client.register_script(EXPIRE)

    def __repr__(self) -> str:
        return f"RedisSchedule({self._where!r}, prefix={self.prefix!r})"

    @contextmanager
    def _calling(self) -> Iterator[Any]:
        if self._closed:
            raise StoreError(f"{self!r} was closed")
        try:
            yield self._client
        except redis.RedisError as exc:
            raise StoreError(f"{self!r}: {type(exc).__name__}: {exc}") from exc

    def add(self, entries: Sequence[Entry]) -> list[bool]:
        check_new(entries)
        if not entries:
            return []
        rows, bodies = [], []
        for e in entries:
            if e.body is not None:
                bodies.append(e.body)
            rows.append(
                (e.id, e.namespace, e.routing_key, str(e.due_at_ms), e.tier,
                 str(e.published_at_ms), str(e.size), self._texts(e.destinations),
                 e.business_key, self._texts(e.labels), e.state.value, str(e.generation),
                 str(e.changed_at_ms), None if e.body is None else str(len(bodies) + 2),
                 e.content_type, None if e.headers is None else json.dumps(dict(e.headers)),
                 None if e.delay_ms is None else str(e.delay_ms))
            )  # fmt: skip
        with self._calling():
            return [bool(x) for x in self._add(args=[self.prefix, json.dumps(rows), *bodies])]

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
        allowed = ",".join(sorted(s.value for s in allowed_from(to)))
        if not allowed:
            raise InvalidInput(f"no entry moves to {to.value}: entries are added pending")
        if not ids:
            return []
        opt = (
            "" if due_at_ms is None else due_at_ms,
            "" if generation is None else generation,
            tier or "",
        )
        with self._calling():
            after = self._move(
                args=[self.prefix, to.value, now_ms, *opt, allowed, json.dumps(list(ids))]
            )
        return [State(s.decode()) if s else None for s in after]

    def _entries(self, ids: Sequence[str]) -> list[Entry | None]:
        with self._calling() as client:
            pipe = client.pipeline(transaction=False)
            for entry_id in ids:
                pipe.hgetall(self.prefix + "e:" + entry_id)
            found = pipe.execute()
        restore = Restore()
        return [None if not h else restore(_row(i, h)) for i, h in zip(ids, found, strict=True)]

    def get(self, entry_id: str) -> Entry | None:
        return self._entries([entry_id])[0]

    def _namespaces(self, query: Query) -> list[str]:
        if query.namespace is not None:
            return [query.namespace]
        with self._calling() as client:
            return sorted(n.decode() for n in client.smembers(self.prefix + "namespaces"))

    def _bounds(self, query: Query, after: Cursor | None) -> tuple[str, str]:
        low = "-" if query.due_after_ms is None else "[" + f"{query.due_after_ms:015d}"
        if after is not None and (low == "-" or _member(*after) >= low[1:]):
            low = "(" + _member(*after)
        high = "+" if query.due_before_ms is None else "(" + f"{query.due_before_ms:015d}"
        return low, high

    def _ordered(self, query: Query, after: Cursor | None) -> Iterator[str]:
        """The ids of the query's states and due window, in page order after ``after``."""
        if query.ids is not None or query.business_key is not None:
            yield from self._by_key(query, after)
            return
        low, high = self._bounds(query, after)
        sets = [
            self._members(f"{self.prefix}s:{ns}:{state.value}", low, high)
            for ns in self._namespaces(query)
            for state in query.states
        ]
        for member in heapq.merge(*sets):
            yield member.partition(":")[2]

    def _members(self, key: str, low: str, high: str) -> Iterator[str]:
        while True:
            with self._calling() as client:
                page = [m.decode() for m in client.zrangebylex(key, low, high, 0, _PAGE)]
            yield from page
            if len(page) < _PAGE:
                return
            low = "(" + page[-1]

    def _by_key(self, query: Query, after: Cursor | None) -> Iterator[str]:
        if query.ids is not None:
            ids = sorted(query.ids)
        else:
            with self._calling() as client:
                found = client.smembers(f"{self.prefix}k:{query.business_key}")
            ids = sorted(i.decode() for i in found)
        entries = [e for e in self._entries(ids) if e is not None and query.matches(e)]
        for e in sorted(entries, key=lambda e: (e.due_at_ms, e.id)):
            if after is None or (e.due_at_ms, e.id) > tuple(after):
                yield e.id

    def find(self, query: Query, *, after: Cursor | None = None, limit: int = 100) -> list[Entry]:
        check_limit(limit)
        found: list[Entry] = []
        batch: list[str] = []
        for entry_id in self._ordered(query, after):
            batch.append(entry_id)
            if len(batch) >= max(limit - len(found), 1) or len(batch) >= _PAGE:
                found += [e for e in self._entries(batch) if e is not None and query.matches(e)]
                batch = []
                if len(found) >= limit:
                    return found[:limit]
        found += [e for e in self._entries(batch) if e is not None and query.matches(e)]
        return found[:limit]

    def count(self, query: Query) -> int:
        plain = Query(
            namespace=query.namespace, states=query.states,
            due_after_ms=query.due_after_ms, due_before_ms=query.due_before_ms,
        )  # fmt: skip
        if query != plain:  # filters the sets do not hold: read the entries
            total, after = 0, None
            while page := self.find(query, after=after, limit=_PAGE):
                total += len(page)
                after = (page[-1].due_at_ms, page[-1].id)
            return total
        low, high = self._bounds(query, None)
        with self._calling() as client:
            pipe = client.pipeline(transaction=False)
            for ns in self._namespaces(query):
                for state in query.states:
                    pipe.zlexcount(f"{self.prefix}s:{ns}:{state.value}", low, high)
            return sum(int(n) for n in pipe.execute())

    def tiers(self, query: Query) -> dict[str, int]:
        found: dict[str, int] = {}
        plain = Query(namespace=query.namespace, states=query.states)
        if query != plain:  # filters the counters do not hold: read the entries
            after = None
            while page := self.find(query, after=after, limit=_PAGE):
                for e in page:
                    found[e.tier] = found.get(e.tier, 0) + 1
                after = (page[-1].due_at_ms, page[-1].id)
            return found
        with self._calling() as client:
            pipe = client.pipeline(transaction=False)
            for ns in self._namespaces(query):
                for state in query.states:
                    pipe.hgetall(f"{self.prefix}c:{ns}:{state.value}")
            for counters in pipe.execute():
                for tier, n in counters.items():
                    found[tier.decode()] = found.get(tier.decode(), 0) + int(n)
        return {tier: n for tier, n in found.items() if n > 0}

    def expire(self, *, finished_before_ms: int) -> int:
        gone = 0
        for ns in self._namespaces(Query()):
            while True:
                with self._calling() as client:
                    ids = client.zrangebyscore(
                        f"{self.prefix}f:{ns}", "-inf", f"({finished_before_ms}", 0, _PAGE
                    )
                    if not ids:
                        break
                    gone += int(self._expire(args=[self.prefix, ns, finished_before_ms, *ids]))
        return gone

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._client.close()


def _row(entry_id: str, fields: dict[bytes, bytes]) -> list[Any]:
    """A hash's fields as a row in :data:`~delayq.schedule.entry.FIELDS` order."""
    row: list[Any] = []
    for name in FIELDS:
        value = fields.get(name.encode())
        if name == "id":
            row.append(entry_id)
        elif value is None or name == "body":
            row.append(value)
        elif name in _INTS:
            row.append(int(value))
        else:
            row.append(value.decode())
    return row
