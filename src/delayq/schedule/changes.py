"""What ``Schedule`` and ``AsyncSchedule`` share to change the schedule: the checks of a
change (the publisher, the ids, the namespace) and the messages it sends again. Pure
but for the index reads of :func:`entries_for`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from delayq.errors import InvalidInput
from delayq.message.envelope import CONTENT_JSON, CONTENT_TEXT
from delayq.message.reschedule import Reschedule
from delayq.schedule.base import ScheduleStore
from delayq.schedule.entry import Entry
from delayq.schedule.query import Query

__all__ = ["again", "checked_changer", "entries_for", "kept_body", "purge_query"]


def kept_body(entry: Entry) -> object:
    """The body ``entry`` was published with, as ``publish`` takes it (the same bytes
    and content type come out), or :class:`~delayq.errors.InvalidInput` if the index did
    not keep it."""
    if not entry.kept or entry.body is None:
        raise InvalidInput(
            f"message {entry.id!r}: the index did not keep its body and headers (publish "
            "with ScheduleIndex(keep_bodies=...) above its size, a body delayq encodes and "
            "JSON headers), so it cannot be sent again by its id alone: reschedule it with "
            "its body"
        )
    try:
        if entry.content_type == CONTENT_JSON:
            return json.loads(entry.body)
        if entry.content_type == CONTENT_TEXT:
            return entry.body.decode("utf-8")
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise InvalidInput(
            f"message {entry.id!r}: its kept body is not what its content type "
            f"({entry.content_type}) says ({type(exc).__name__}: {exc})"
        ) from None
    return entry.body


def checked_changer(publisher: Any, store: ScheduleStore, kind: str) -> Any:
    """``publisher``, if it can change this index: given the consumers' store and this
    index (``kind``: the class asking, for the message)."""
    if publisher is None or publisher.store is None or publisher.schedule is None:
        raise InvalidInput(
            f"changing the schedule needs {kind}(store, publisher) with a publisher "
            "given the consumers' store (store=) and this index (schedule=)"
        )
    if publisher.schedule.store is not store:
        raise InvalidInput("the publisher's schedule= is another index than this one")
    return publisher


def entries_for(store: ScheduleStore, message_ids: Sequence[str], namespace: str) -> list[Entry]:
    """The entries of ``message_ids``, each in ``namespace`` (the publisher's): an entry
    of another namespace would send a copy where its message never was."""
    if isinstance(message_ids, str):
        raise InvalidInput("message_ids is a list of ids, not one str")
    found = []
    for message_id in dict.fromkeys(message_ids):
        entry = store.get(message_id)
        if entry is None:
            raise InvalidInput(f"message {message_id!r} is not in the schedule index")
        if entry.namespace != namespace:
            raise InvalidInput(
                f"message {message_id!r} is in namespace {entry.namespace!r}, not "
                f"{namespace!r} (the publisher's topology: check -f/--file)"
            )
        found.append(entry)
    return found


def purge_query(query: Query, namespace: str) -> Query:
    """``query`` held to the publisher's ``namespace``."""
    if query.namespace is None:
        return replace(query, namespace=namespace)
    if query.namespace != namespace:
        raise InvalidInput(
            f"the query is of namespace {query.namespace!r}, the publisher's {namespace!r}"
        )
    return query


def sent_again(entry: Entry) -> dict[str, Any]:
    """What a message is sent again with from its entry (a reschedule, an import): its
    kept body and headers, routing key, id and strategy."""
    return {
        "body": kept_body(entry),
        "routing_key": entry.routing_key,
        "message_id": entry.id,
        "headers": dict(entry.headers or {}),
        "strategy": "exact" if entry.tier == "exact" else None,
    }


def again(entry: Entry, delay: object, due_at: datetime | None) -> Reschedule:
    return Reschedule(**sent_again(entry), delay=delay, due_at=due_at)
