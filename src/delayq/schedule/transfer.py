"""Export the schedule index as JSON lines and import them on another broker or namespace,
keeping ids and due times: a disaster-recovery and a migration path.

A line is one entry (``delayq scheduled list --json``'s fields) with its body in base64,
its content type and headers when the index kept them. Import publishes each line's
message again with the same id, due at its due time (now if that has passed), through a
publisher: into the smallest tier at or above what is left of its wait, as any publish.
A message whose body the index did not keep cannot be sent again: import counts it,
never drops it silently.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import IO, Any, Protocol

from delayq.errors import InvalidInput
from delayq.message.envelope import Message, Receipt
from delayq.schedule.api import kept_body
from delayq.schedule.changes import sent_again
from delayq.schedule.entry import Entry, State
from delayq.schedule.record import KEPT_CONTENT
from delayq.topology.model import Topology

__all__ = [
    "Imported",
    "Sendable",
    "entry_fields",
    "entry_from",
    "entry_line",
    "export_lines",
    "publish_again",
    "read_lines",
    "to_messages",
]

FORMAT = "delayq.schedule/1"


def entry_fields(entry: Entry) -> dict[str, Any]:
    """What ``entry`` says, as JSON values (its kept body, content type and headers
    aside): the fields of ``delayq scheduled list --json`` and of an export's lines."""
    return {
        "id": entry.id,
        "namespace": entry.namespace,
        "routing_key": entry.routing_key,
        "destinations": list(entry.destinations),
        "state": entry.state.value,
        "tier": entry.tier,
        "due_at_ms": entry.due_at_ms,
        "published_at_ms": entry.published_at_ms,
        "size": entry.size,
        "business_key": entry.business_key,
        "labels": dict(entry.labels),
        "generation": entry.generation,
        "delay_ms": entry.delay_ms,
    }


def entry_line(entry: Entry) -> str:
    """``entry`` as one JSON line."""
    return json.dumps(
        {
            "format": FORMAT,
            **entry_fields(entry),
            "body": None if entry.body is None else base64.b64encode(entry.body).decode(),
            "content_type": entry.content_type,
            "headers": None if entry.headers is None else dict(entry.headers),
        },
        separators=(",", ":"),
    )


def export_lines(entries: Iterable[Entry], out: IO[str]) -> int:
    """Write ``entries`` to ``out``, a line each; how many."""
    count = 0
    for entry in entries:
        out.write(entry_line(entry) + "\n")
        count += 1
    return count


def _entry(number: int, text: str) -> Entry:
    where = f"line {number}"
    try:
        fields = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{where}: not JSON ({exc})") from None
    if not isinstance(fields, dict) or fields.get("format") != FORMAT:
        raise InvalidInput(f"{where}: not a line of delayq scheduled export ({FORMAT})")
    missing = [name for name in _LINE_FIELDS if name not in fields]
    if missing:
        raise InvalidInput(
            f"{where}: no {', '.join(map(repr, missing))} (a line of delayq scheduled export "
            f"has {', '.join(_LINE_FIELDS)})"
        )
    body = fields["body"]
    try:
        raw = None if body is None else base64.b64decode(body, validate=True)
    except (TypeError, ValueError, binascii.Error) as exc:
        raise InvalidInput(f"{where}: body is not base64 text ({exc})") from None
    return entry_from(fields, raw, where)


def entry_from(fields: dict[str, Any], body: bytes | None, where: str) -> Entry:
    """The entry ``fields`` (an export's, by name) and ``body`` describe, checked;
    :class:`~delayq.errors.InvalidInput` says ``where`` it is wrong."""
    try:
        state = State(fields["state"])
    except (TypeError, ValueError):
        states = ", ".join(s.value for s in State)
        raise InvalidInput(f"{where}: state {fields['state']!r} is none of {states}") from None
    destinations = fields["destinations"]
    if not isinstance(destinations, list) or not all(isinstance(q, str) for q in destinations):
        raise InvalidInput(f"{where}: destinations is a list of queues, not {destinations!r}")
    try:
        return Entry(
            fields["id"],
            fields["namespace"],
            fields["routing_key"],
            due_at_ms=fields["due_at_ms"],
            tier=fields["tier"],
            published_at_ms=fields["published_at_ms"],
            size=fields["size"],
            destinations=tuple(destinations),
            business_key=fields["business_key"],
            labels=fields["labels"],
            state=state,
            generation=fields["generation"],
            body=body,
            content_type=fields["content_type"],
            headers=fields["headers"],
            delay_ms=fields.get("delay_ms"),  # not in an older delayq's exports
        )
    except InvalidInput as exc:
        raise InvalidInput(f"{where}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"{where}: {exc}") from None


_LINE_FIELDS = ("id", "namespace", "routing_key", "destinations", "state", "tier", "due_at_ms",
                "published_at_ms", "size", "business_key", "labels", "generation", "body",
                "content_type", "headers")  # fmt: skip


def read_lines(lines: Iterable[str]) -> Iterator[Entry]:
    """The entries of an export, checked line by line (blank lines skipped)."""
    for number, text in enumerate(lines, 1):
        if text.strip():
            yield _entry(number, text)


IMPORTED = frozenset({State.PENDING, State.SCHEDULED, State.RESCHEDULED})
"""The states an import schedules again: waiting, or perhaps at the source's broker
(pending). The others are over or out of the tiers (cancelled, handled, delivered...)."""


def importable(entries: Sequence[Entry]) -> tuple[list[Entry], list[Entry]]:
    """``entries`` to schedule again, and those skipped (no longer waiting); every kept
    body checked first (one its content type does not describe: ``InvalidInput``)."""
    todo = [e for e in entries if e.state in IMPORTED]
    for entry in todo:
        if entry.body is not None and entry.content_type not in KEPT_CONTENT:
            raise InvalidInput(
                f"message {entry.id!r}: content type {entry.content_type!r} is not one an "
                f"index keeps ({', '.join(KEPT_CONTENT)}): its body cannot be sent again as it was"
            )
        if entry.kept:
            kept_body(entry)
    return todo, [e for e in entries if e.state not in IMPORTED]


@dataclass
class Imported:
    """What an import did."""

    receipts: list[Receipt] = field(default_factory=list)
    not_kept: list[str] = field(default_factory=list)
    """Ids whose body the exporting index did not keep: not sent (publish them again)."""


class Sendable:
    """Checks an entry's message against the topology it is imported into, as its publish
    would (routing key bound, delay within the ladder, id, body size), naming the entry:
    so that an import refuses before anything is sent, not a batch in."""

    def __init__(self, topology: Topology) -> None:
        from delayq.message.factory import MessageFactory

        self._factory = MessageFactory(topology)

    def check(self, entry: Entry, now_ms: int) -> None:
        if not entry.kept:
            return  # not sent: listed as not kept
        wait = timedelta(milliseconds=max(0, entry.due_at_ms - now_ms))
        try:
            self._factory.build(**sent_again(entry), delay=wait)
        except InvalidInput as exc:
            raise InvalidInput(f"entry {entry.id!r}: {exc}") from None


class _Publishing(Protocol):
    def publish_many(self, messages: Iterable[Message], *, window: int = ...) -> list[Receipt]: ...


def to_messages(entries: Sequence[Entry], now_ms: int) -> tuple[list[Message], list[str]]:
    """The messages to publish again (due at each entry's due time) and the ids whose body
    was not kept."""
    messages, not_kept = [], []
    for entry in entries:
        if not entry.kept:
            not_kept.append(entry.id)
            continue
        wait = timedelta(milliseconds=max(0, entry.due_at_ms - now_ms))
        messages.append(Message(**sent_again(entry), delay=wait))
    return messages, not_kept


def publish_again(
    publisher: _Publishing, entries: Sequence[Entry], now_ms: int, *, window: int = 1000
) -> Imported:
    """Publish ``entries`` again through ``publisher`` (every message built and checked
    before any is sent)."""
    messages, not_kept = to_messages(entries, now_ms)
    done = Imported(not_kept=not_kept)
    if messages:
        done.receipts = publisher.publish_many(messages, window=window)
    return done
