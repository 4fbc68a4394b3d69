"""``Schedule``: what the schedule index answers and what an operator does with it, in
Python, as ``delayq scheduled`` does on the command line.

Reading needs the index's store only. Changing needs a ``Publisher`` with the consumers'
idempotency store (``store=``) and this index (``schedule=``): a reschedule, a promote
and a purge are a publisher's reschedules and cancels, so the consumers' marks decide
which copy is handled, and the index follows.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING

from delayq.durations import Duration, to_ms
from delayq.errors import InvalidInput
from delayq.message.cancel import CancelReceipt, RescheduleReceipt
from delayq.message.envelope import CONTENT_JSON, CONTENT_TEXT, epoch_ms
from delayq.message.reschedule import Reschedule
from delayq.schedule.base import ScheduleStore, check_limit
from delayq.schedule.entry import Entry, State
from delayq.schedule.query import Cursor, Query, page_key

if TYPE_CHECKING:
    from delayq.sync.publisher import Publisher

__all__ = ["PurgeReport", "Schedule", "kept_body"]

BATCH = 500
"""Entries a purge cancels in one store round trip."""


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


@dataclass(frozen=True)
class PurgeReport:
    """What a purge did: the cancels' receipts; ``stopped`` is how many were cancelled
    (``receipts`` also holds those that lost the race with a handler)."""

    receipts: list[CancelReceipt]

    @property
    def stopped(self) -> int:
        return sum(r.cancelled for r in self.receipts)


class Schedule:
    """The schedule index of ``store``; ``publisher`` (a ``Publisher`` with ``store=`` and
    ``schedule=`` on this index) for the changes."""

    def __init__(self, store: ScheduleStore, publisher: Publisher | None = None) -> None:
        self.store = store
        self.publisher = publisher

    def iterate(self, query: Query | None = None, *, page: int = 1000) -> Iterator[Entry]:
        """Every match, soonest due first, a page at a time."""
        check_limit(page)
        after: Cursor | None = None
        while found := self.store.find(query or Query(), after=after, limit=page):
            yield from found
            after = page_key(found[-1])

    def count(self, query: Query | None = None) -> int:
        return self.store.count(query or Query())

    def show(self, message_id: str) -> Entry | None:
        return self.store.get(message_id)

    def _changer(self) -> Publisher:
        publisher = self.publisher
        if publisher is None or publisher.store is None or publisher.schedule is None:
            raise InvalidInput(
                "changing the schedule needs Schedule(store, publisher) with a Publisher "
                "given the consumers' store (store=) and this index (schedule=)"
            )
        if publisher.schedule.store is not self.store:
            raise InvalidInput("the publisher's schedule= is another index than this one")
        return publisher

    def _entries(self, message_ids: Sequence[str], namespace: str) -> list[Entry]:
        """The entries of ``message_ids``, each in ``namespace`` (the publisher's): an
        entry of another namespace would send a copy where its message never was."""
        if isinstance(message_ids, str):
            raise InvalidInput("message_ids is a list of ids, not one str")
        found = []
        for message_id in dict.fromkeys(message_ids):
            entry = self.store.get(message_id)
            if entry is None:
                raise InvalidInput(f"message {message_id!r} is not in the schedule index")
            if entry.namespace != namespace:
                raise InvalidInput(
                    f"message {message_id!r} is in namespace {entry.namespace!r}, not "
                    f"{namespace!r} (the publisher's topology: check -f/--file)"
                )
            found.append(entry)
        return found

    def reschedule(
        self, message_ids: Sequence[str], delay: object = None, *, due_at: datetime | None = None
    ) -> list[RescheduleReceipt]:
        """Move each message to ``delay`` from now (or ``due_at``) by its id alone: the
        index kept its body, headers and routing key. Every id is checked first (not in
        the index, body not kept: nothing is done)."""
        publisher = self._changer()
        entries = self._entries(message_ids, publisher.topology.namespace)
        items = [_again(e, delay, due_at) for e in entries]
        return publisher.reschedule_many(items)

    def promote(self, message_ids: Sequence[str]) -> list[RescheduleReceipt]:
        """Deliver each message now: a copy of generation above the waiting one's goes to
        its destinations at once, and the waiting copy, when due, meets the consumers'
        mark and is acked unhandled (it never reaches a handler twice with a store)."""
        publisher = self._changer()
        entries = self._entries(message_ids, publisher.topology.namespace)
        items = [_again(e, "0s", None) for e in entries]
        receipts = publisher.reschedule_many(items)
        sent = [r.receipt.message_id for r in receipts if r.receipt is not None]
        if sent:
            self.store.move(sent, State.PROMOTED, now_ms=publisher.factory.now_ms())
        return receipts

    def cancel(self, message_ids: Sequence[str]) -> list[CancelReceipt]:
        """Cancel each message by its id (every id checked in the index first: nothing is
        done if one is missing); a receipt each, as ``Publisher.cancel_many``'s."""
        publisher = self._changer()
        entries = self._entries(message_ids, publisher.topology.namespace)
        return publisher.cancel_many(message_ids=[e.id for e in entries])

    def expire(self, older_than: Duration) -> int:
        """Delete the entries of finished messages (unconfirmed, cancelled, handled,
        dead-lettered) that last changed more than ``older_than`` ago; how many. Waiting
        entries are never deleted. Reading needs no publisher."""
        now = self.publisher.factory.now_ms() if self.publisher is not None else epoch_ms()
        return self.store.expire(finished_before_ms=now - to_ms(older_than, what="older_than"))

    def purge(
        self,
        query: Query,
        *,
        progress: Callable[[int], None] | None = None,
        batch: int = BATCH,
    ) -> PurgeReport:
        """Cancel every match of ``query`` (in the waiting states unless it says
        otherwise), ``batch`` a store round trip; ``progress(n)`` after each."""
        publisher = self._changer()
        check_limit(batch)
        namespace = publisher.topology.namespace
        if query.namespace is None:
            query = replace(query, namespace=namespace)
        elif query.namespace != namespace:
            raise InvalidInput(
                f"the query is of namespace {query.namespace!r}, the publisher's {namespace!r}"
            )
        receipts: list[CancelReceipt] = []
        after: Cursor | None = None
        while found := self.store.find(query, after=after, limit=batch):
            receipts += publisher.cancel_many(message_ids=[e.id for e in found])
            after = page_key(found[-1])
            if progress is not None:
                progress(len(receipts))
        return PurgeReport(receipts)

    # Last in the class: below it, ``list`` in an annotation would mean this method.
    def list(
        self, query: Query | None = None, *, after: Cursor | None = None, limit: int = 100
    ) -> list[Entry]:
        """One page of matches, soonest due first (``after``: the last one's
        :func:`~delayq.schedule.query.page_key`)."""
        return self.store.find(query or Query(), after=after, limit=limit)


def _again(entry: Entry, delay: object, due_at: datetime | None) -> Reschedule:
    return Reschedule(
        kept_body(entry),
        entry.routing_key,
        delay,
        message_id=entry.id,
        headers=dict(entry.headers or {}),
        strategy="exact" if entry.tier == "exact" else None,
        due_at=due_at,
    )
