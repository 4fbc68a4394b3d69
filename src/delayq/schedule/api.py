"""``Schedule``: what the schedule index answers and what an operator does with it, in
Python, as ``delayq scheduled`` does on the command line.

Reading needs the index's store only. Changing needs a ``Publisher`` with the consumers'
idempotency store (``store=``) and this index (``schedule=``): a reschedule, a promote
and a purge are a publisher's reschedules and cancels, so the consumers' marks decide
which copy is handled, and the index follows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from delayq.durations import Duration, to_ms
from delayq.message.cancel import CancelReceipt, RescheduleReceipt
from delayq.message.envelope import epoch_ms
from delayq.schedule.base import ScheduleStore, check_limit
from delayq.schedule.changes import again, checked_changer, entries_for, kept_body, purge_query
from delayq.schedule.entry import Entry, State
from delayq.schedule.query import Cursor, Query, page_key

if TYPE_CHECKING:
    from delayq.sync.publisher import Publisher

__all__ = ["PurgeReport", "Schedule", "kept_body"]

BATCH = 500
"""Entries a purge cancels in one store round trip."""


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
        return checked_changer(self.publisher, self.store, "Schedule")  # type: ignore[no-any-return]

    def reschedule(
        self, message_ids: Sequence[str], delay: object = None, *, due_at: datetime | None = None
    ) -> list[RescheduleReceipt]:
        """Move each message to ``delay`` from now (or ``due_at``) by its id alone: the
        index kept its body, headers and routing key. Every id is checked first (not in
        the index, body not kept: nothing is done)."""
        publisher = self._changer()
        entries = entries_for(self.store, message_ids, publisher.topology.namespace)
        items = [again(e, delay, due_at) for e in entries]
        return publisher.reschedule_many(items)

    def promote(self, message_ids: Sequence[str]) -> list[RescheduleReceipt]:
        """Deliver each message now: a copy of generation above the waiting one's goes to
        its destinations at once, and the waiting copy, when due, meets the consumers'
        mark and is acked unhandled (it never reaches a handler twice with a store)."""
        publisher = self._changer()
        entries = entries_for(self.store, message_ids, publisher.topology.namespace)
        items = [again(e, "0s", None) for e in entries]
        receipts = publisher.reschedule_many(items)
        sent = [r.receipt.message_id for r in receipts if r.receipt is not None]
        if sent:
            self.store.move(sent, State.PROMOTED, now_ms=publisher.factory.now_ms())
        return receipts

    def cancel(self, message_ids: Sequence[str]) -> list[CancelReceipt]:
        """Cancel each message by its id (every id checked in the index first: nothing is
        done if one is missing); a receipt each, as ``Publisher.cancel_many``'s."""
        publisher = self._changer()
        entries = entries_for(self.store, message_ids, publisher.topology.namespace)
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
        query = purge_query(query, publisher.topology.namespace)
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
