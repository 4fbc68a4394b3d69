"""What a schedule index store does, and the one rule every store applies when it records
a message again (a publish retried with the same id).

Every method is one atomic step in the store (one transaction, one script): an entry is
moved only from the states :func:`delayq.schedule.entry.allowed_from` allows, checked
against its state at that moment, so reports arriving out of order from several
processes never move an entry back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from delayq.errors import InvalidInput
from delayq.schedule.entry import FINISHED, MAX_MS, Entry, State
from delayq.schedule.query import Cursor, Query

__all__ = [
    "REPLACEABLE",
    "JsonTexts",
    "ScheduleStore",
    "check_limit",
    "check_move",
    "check_new",
    "replaces",
]

REPLACEABLE = FINISHED | {State.PENDING}
"""An entry a new record of the same id replaces: one not confirmed yet (the publish is
being sent again), or one whose message is over, but for a cancelled entry of the same
namespace (:func:`replaces`). Any other keeps its entry: the new publish is a duplicate
the consumers' store will skip."""


def replaces(old: State, old_namespace: str, new_namespace: str) -> bool:
    """Whether a new record replaces an entry in ``old``: a cancelled message published
    again under its id in its namespace stays cancelled (the consumers skip the copy: a
    cancel is final), where another namespace's (a migration) is replaced."""
    if old is State.CANCELLED:
        return old_namespace != new_namespace
    return old in REPLACEABLE


@runtime_checkable
class ScheduleStore(Protocol):
    def add(self, entries: Sequence[Entry]) -> list[bool]:
        """Record ``entries`` (each :attr:`State.PENDING`); for each, whether it was
        recorded (``False``: an entry of that id is live and was kept)."""
        ...

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
        """Move each entry of ``ids`` to ``to`` where its state allows it (and set its
        due time, generation and tier, a reschedule's); for each, its state after the move
        (``to``, or the state that refused it), ``None`` for an id not in the store."""
        ...

    def get(self, entry_id: str) -> Entry | None: ...

    def find(self, query: Query, *, after: Cursor | None = None, limit: int = 100) -> list[Entry]:
        """Up to ``limit`` matching entries in :func:`delayq.schedule.query.page_key`
        order, after the cursor."""
        ...

    def count(self, query: Query) -> int: ...

    def tiers(self, query: Query) -> dict[str, int]:
        """How many entries match ``query``, by tier (tiers with none left out)."""
        ...

    def expire(self, *, finished_before_ms: int) -> int:
        """Delete entries in a finished state that last changed before; how many."""
        ...

    def close(self) -> None: ...


def check_new(entries: Sequence[Entry]) -> Sequence[Entry]:
    """``entries`` to add: each pending, no id twice."""
    seen: set[str] = set()
    for entry in entries:
        if not isinstance(entry, Entry):
            raise InvalidInput(f"a schedule index records Entry objects, not {entry!r}")
        if entry.state is not State.PENDING:
            raise InvalidInput(f"entry {entry.id!r} is recorded pending, not {entry.state.value}")
        if entry.id in seen:
            raise InvalidInput(f"entry {entry.id!r} is twice in one batch")
        seen.add(entry.id)
    return entries


def check_move(to: object, tier: object = None, **values: int | None) -> None:
    """A move's state and times (``now_ms``, ``due_at_ms``, ``generation``): a
    :class:`State` and ints of 0 or more (``None``: unchanged)."""
    if not isinstance(to, State):
        raise InvalidInput(f"entries move to a State, not {to!r}")
    if tier is not None and (not isinstance(tier, str) or not tier):
        raise InvalidInput(f"a move's tier is a non-empty str, not {tier!r}")
    for name, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_MS:
            raise InvalidInput(f"a move's {name} is an int from 0 to {MAX_MS - 1}, not {value!r}")


MAX_PAGE = 1_000_000
"""The most entries one page (``find``'s ``limit``) may ask for."""


def check_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise InvalidInput(f"a page (limit) holds 1 to {MAX_PAGE:,} entries, not {limit!r}")
    return limit


class JsonTexts:
    """The JSON text of an entry's destinations or labels for a SQL store's row, each
    value encoded once: a publisher's entries share one tuple of destinations per routing
    key and one labels mapping (it keeps them), so a batch's rows cost a lookup each, not
    an encoding. Keyed by identity, holding the value, so an id is never reused while cached."""

    __slots__ = ("_by_id",)

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[object, str]] = {}

    def __call__(self, value: tuple[str, ...] | Mapping[str, str]) -> str:
        found = self._by_id.get(id(value))
        if found is not None and found[0] is value:
            return found[1]
        text = json.dumps(list(value) if isinstance(value, tuple) else dict(value))
        if len(self._by_id) >= 4096:
            self._by_id.clear()
        self._by_id[id(value)] = (value, text)
        return text
