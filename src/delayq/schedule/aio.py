"""``AsyncSchedule``: :class:`~delayq.schedule.api.Schedule` on asyncio, for a web app's
admin page or an async worker: the same reads and changes, the index read in a thread
when its store blocks (SQLite, PostgreSQL, Redis), the changes made by an
``AsyncPublisher`` given the consumers' store and this index.

>>> schedule = AsyncSchedule(index, publisher)                     # doctest: +SKIP
>>> waiting = await schedule.count(Query(due_before_ms=soon))       # doctest: +SKIP
>>> await schedule.promote(["order-42"])                            # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from delayq.durations import Duration, to_ms
from delayq.message.cancel import CancelReceipt, RescheduleReceipt
from delayq.message.envelope import epoch_ms
from delayq.schedule.api import BATCH, PurgeReport
from delayq.schedule.base import ScheduleStore, check_limit
from delayq.schedule.changes import again, checked_changer, entries_for, purge_query
from delayq.schedule.entry import Entry, State
from delayq.schedule.query import Cursor, Query, page_key

if TYPE_CHECKING:
    from delayq.aio.publisher import AsyncPublisher

__all__ = ["AsyncSchedule"]

T = TypeVar("T")


class AsyncSchedule:
    """The schedule index of ``store`` on asyncio; ``publisher`` (an ``AsyncPublisher``
    with ``store=`` and ``schedule=`` on this index) for the changes."""

    def __init__(self, store: ScheduleStore, publisher: AsyncPublisher | None = None) -> None:
        self.store = store
        self.publisher = publisher

    async def _call(self, read: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if getattr(self.store, "blocking", True):
            return await asyncio.to_thread(read, *args, **kwargs)
        return read(*args, **kwargs)

    async def count(self, query: Query | None = None) -> int:
        return await self._call(self.store.count, query or Query())

    async def show(self, message_id: str) -> Entry | None:
        return await self._call(self.store.get, message_id)

    def _changer(self) -> AsyncPublisher:
        return checked_changer(self.publisher, self.store, "AsyncSchedule")  # type: ignore[no-any-return]

    async def _entries(self, publisher: AsyncPublisher, ids: Sequence[str]) -> list[Entry]:
        return await self._call(entries_for, self.store, ids, publisher.topology.namespace)

    async def cancel(self, message_ids: Sequence[str]) -> list[CancelReceipt]:
        """:meth:`Schedule.cancel <delayq.schedule.api.Schedule.cancel>` on asyncio."""
        publisher = self._changer()
        entries = await self._entries(publisher, message_ids)
        return await publisher.cancel_many(message_ids=[e.id for e in entries])

    async def reschedule(
        self, message_ids: Sequence[str], delay: object = None, *, due_at: datetime | None = None
    ) -> list[RescheduleReceipt]:
        """:meth:`Schedule.reschedule <delayq.schedule.api.Schedule.reschedule>` on asyncio."""
        publisher = self._changer()
        entries = await self._entries(publisher, message_ids)
        return await publisher.reschedule_many([again(e, delay, due_at) for e in entries])

    async def promote(self, message_ids: Sequence[str]) -> list[RescheduleReceipt]:
        """:meth:`Schedule.promote <delayq.schedule.api.Schedule.promote>` on asyncio."""
        publisher = self._changer()
        entries = await self._entries(publisher, message_ids)
        receipts = await publisher.reschedule_many([again(e, "0s", None) for e in entries])
        sent = [r.receipt.message_id for r in receipts if r.receipt is not None]
        if sent:
            now = publisher.factory.now_ms()
            await self._call(self.store.move, sent, State.PROMOTED, now_ms=now)
        return receipts

    async def purge(
        self,
        query: Query,
        *,
        progress: Callable[[int], None] | None = None,
        batch: int = BATCH,
    ) -> PurgeReport:
        """:meth:`Schedule.purge <delayq.schedule.api.Schedule.purge>` on asyncio."""
        publisher = self._changer()
        check_limit(batch)
        query = purge_query(query, publisher.topology.namespace)
        receipts: list[CancelReceipt] = []
        after: Cursor | None = None
        while found := await self._call(self.store.find, query, after=after, limit=batch):
            receipts += await publisher.cancel_many(message_ids=[e.id for e in found])
            after = page_key(found[-1])
            if progress is not None:
                progress(len(receipts))
        return PurgeReport(receipts)

    async def expire(self, older_than: Duration) -> int:
        """:meth:`Schedule.expire <delayq.schedule.api.Schedule.expire>` on asyncio."""
        now = self.publisher.factory.now_ms() if self.publisher is not None else epoch_ms()
        cutoff = now - to_ms(older_than, what="older_than")
        return await self._call(self.store.expire, finished_before_ms=cutoff)

    # Last in the class: below it, ``list`` in an annotation would mean this method.
    async def list(
        self, query: Query | None = None, *, after: Cursor | None = None, limit: int = 100
    ) -> list[Entry]:
        """One page of matches, soonest due first."""
        return await self._call(self.store.find, query or Query(), after=after, limit=limit)
