"""How a publisher keeps the schedule index: an entry written *pending* before its message
is sent, moved to *scheduled* by the confirm or to *unconfirmed* by a failure.

So a message whose confirm reached the caller is in the index, and a message the process
died sending shows as pending (not confirmed) rather than scheduled. The steps are pure
but for the store calls; the publishers call them around their send, the asyncio one in
a thread when the store blocks.

If the pending write fails, nothing is sent: the publish raises
:class:`~delayq.errors.ScheduleNotRecorded` (a :class:`~delayq.errors.StoreError`). If
the confirm's write fails, the message *was* confirmed: the publish raises
``ScheduleNotRecorded`` carrying its receipts, the entry stays pending, and a consumer's
report moves it on later. Sending it again would be a duplicate (same id: a consumer with
a store skips it).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from types import MappingProxyType
from typing import Any

from delayq.errors import (
    DelayqError,
    InvalidInput,
    PublishBatchError,
    PublishError,
    ScheduleNotRecorded,
)
from delayq.message.cancel import CancelReceipt, RescheduleReceipt, target_queues
from delayq.message.envelope import (
    CONTENT_BYTES,
    CONTENT_JSON,
    CONTENT_TEXT,
    HEADER_PREFIX,
    OutgoingMessage,
)
from delayq.observe.carrier import TRACEPARENT
from delayq.schedule.base import ScheduleStore
from delayq.schedule.entry import WAITING, Entry, State, checked_labels, unchecked
from delayq.schedule.query import Query
from delayq.topology.model import Topology

__all__ = ["Labeller", "ScheduleIndex", "arecording", "recorded_stream", "recording"]


log = logging.getLogger("delayq.schedule")

KEPT_CONTENT = (CONTENT_JSON, CONTENT_TEXT, CONTENT_BYTES)
"""Bodies the index can send again exactly: those delayq encodes itself."""

Labeller = Callable[[OutgoingMessage], Mapping[str, str]]
"""Labels of one message (a tenant, say), from its routing key, headers or body."""


class ScheduleIndex:
    """A store and what a publisher writes into it: ``labels`` (a mapping for every
    message, or a function of each), ``business_key`` (a function of each message), and
    bodies of up to ``keep_bodies`` bytes (0: none), for ``reschedule`` by id alone;
    ``requested``: the delay each entry keeps as asked for, where it is not the message's
    own (an import: the first publish's, not what was left of it).

    Immediate messages (no delay) are not scheduled and not recorded."""

    def __init__(
        self,
        store: ScheduleStore,
        *,
        labels: Mapping[str, str] | Labeller | None = None,
        business_key: Callable[[OutgoingMessage], str | None] | None = None,
        keep_bodies: int = 0,
        requested: Callable[[OutgoingMessage], int | None] | None = None,
    ) -> None:
        if isinstance(keep_bodies, bool) or not isinstance(keep_bodies, int) or keep_bodies < 0:
            raise InvalidInput(f"keep_bodies is a size in bytes (an int >= 0), not {keep_bodies!r}")
        if labels is not None and not callable(labels) and not isinstance(labels, Mapping):
            raise InvalidInput(f"labels are a mapping or a function of a message, not {labels!r}")
        self.store = store
        self._labels = labels
        self._fixed = None if callable(labels) else checked_labels(labels or {})
        self._business_key = business_key
        self.keep_bodies = keep_bodies
        self._requested = requested
        self._destinations: dict[tuple[str, str], tuple[str, ...]] = {}

    def __repr__(self) -> str:
        return f"ScheduleIndex({self.store!r})"

    def entries(self, topology: Topology, messages: Sequence[OutgoingMessage]) -> list[Entry]:
        """The pending entries of ``messages`` (the delayed ones; an id twice among them,
        its first: one entry per id, as for an id that waits already)."""
        seen: set[str] = set()
        found = []
        for m in messages:
            if m.receipt.tier is not None and m.message_id not in seen:
                seen.add(m.message_id)
                found.append(self._entry(topology, m))
        return found

    def _entry(self, topology: Topology, msg: OutgoingMessage) -> Entry:
        # Built unchecked: the message was checked by its factory, the labels here.
        receipt = msg.receipt
        labels = self.labels_for(msg)
        kept = kept_headers(msg) if self.keep_bodies and len(msg.body) <= self.keep_bodies else None
        business_key = self.business_key_of(msg)
        return unchecked(
            id=msg.message_id,
            namespace=topology.namespace,
            routing_key=msg.routing_key,
            due_at_ms=receipt.published_at_ms + receipt.tier_ms,
            tier=receipt.tier or "",
            published_at_ms=receipt.published_at_ms,
            size=len(msg.body),
            destinations=self._to(topology, msg.routing_key),
            business_key=business_key,
            labels=labels,
            state=State.PENDING,
            generation=0,
            changed_at_ms=receipt.published_at_ms,
            body=None if kept is None else msg.body,
            content_type=None if kept is None else msg.content_type,
            headers=None if kept is None else MappingProxyType(kept),
            delay_ms=receipt.delay_ms if self._requested is None else self._requested(msg),
        )

    def labels_for(self, msg: OutgoingMessage) -> Mapping[str, str]:
        """The labels ``msg``'s entry gets (checked)."""
        if self._fixed is not None:
            return self._fixed
        assert callable(self._labels)
        return checked_labels(self._labels(msg) or {})

    def business_key_of(self, msg: OutgoingMessage) -> str | None:
        """The business key ``msg``'s entry gets (``None``: none)."""
        business_key = self._business_key(msg) if self._business_key else None
        if business_key is not None and not isinstance(business_key, str):
            raise InvalidInput(f"a business key is a str or None, not {business_key!r}")
        return business_key

    def _to(self, topology: Topology, routing_key: str) -> tuple[str, ...]:
        found = self._destinations.get((topology.namespace, routing_key))
        if found is None:
            found = tuple(target_queues(topology, routing_key))
            if len(self._destinations) < 4096:
                self._destinations[(topology.namespace, routing_key)] = found
        return found

    def before(self, topology: Topology, messages: Sequence[OutgoingMessage]) -> list[str]:
        """Write ``messages`` pending; the ids recorded. Raises ``ScheduleNotRecorded``
        (nothing was sent) when the store cannot take them."""
        return self.add_pending(self.entries(topology, messages))

    def add_pending(self, entries: Sequence[Entry]) -> list[str]:
        """:meth:`before` for entries already built (a replay's, say)."""
        if not entries:
            return []
        try:
            added = self.store.add(entries)
            ids = [e.id for e, fits in zip(entries, added, strict=True) if fits]
            kept = [e for e, fits in zip(entries, added, strict=True) if not fits]
            elsewhere = [e.id for e in kept if _held_elsewhere(self.store, e)]
            if elsewhere:  # another namespace's message under the same id: refused
                if ids:
                    self.store.move(ids, State.UNCONFIRMED, now_ms=entries[0].changed_at_ms)
                raise ScheduleNotRecorded(
                    f"message id {elsewhere[0]!r} waits in another namespace of this "
                    f"schedule index ({len(elsewhere)} such): an index holds one entry per "
                    "id, so this publish could not be recorded; nothing was published "
                    "(use ids distinct across namespaces, or an index per namespace)",
                    elsewhere=tuple(elsewhere),
                )
        except ScheduleNotRecorded:
            raise
        except DelayqError as exc:
            raise ScheduleNotRecorded(
                f"the schedule index could not record {len(entries)} message(s); "
                f"nothing was published: {exc}"
            ) from exc
        return ids

    def after(
        self,
        ids: Sequence[str],
        messages: Sequence[OutgoingMessage],
        error: BaseException | None,
        now_ms: int,
    ) -> None:
        """Move the entries ``before`` recorded: scheduled where confirmed, unconfirmed
        where not. Raises ``ScheduleNotRecorded`` when the store cannot take it."""
        if not ids:
            return
        failed = _failed(messages, error)
        mine = set(ids)
        confirmed = {m.message_id for m in messages if m.message_id in mine} - failed
        self.settled(ids, messages, confirmed, error, now_ms)

    def settled(
        self,
        ids: Sequence[str],
        messages: Sequence[OutgoingMessage],
        confirmed: set[str],
        error: BaseException | None,
        now_ms: int,
    ) -> None:
        """:meth:`after` where the caller knows which were confirmed (``confirmed``, ids):
        those of ``ids`` move to scheduled, the others to unconfirmed."""
        if not ids:
            return
        unconfirmed = [i for i in ids if i not in confirmed]
        confirmed_ids = [i for i in ids if i in confirmed]
        try:
            for to, which in ((State.SCHEDULED, confirmed_ids), (State.UNCONFIRMED, unconfirmed)):
                if which:
                    self.store.move(which, to, now_ms=now_ms)
        except DelayqError as exc:
            if error is not None:  # the publish's own error is what the caller must see
                log.error("the schedule index kept %d entries pending: %s", len(ids), exc)
                return
            raise ScheduleNotRecorded(
                f"{len(confirmed_ids)} message(s) were published and confirmed, but the schedule "
                f"index still shows them pending (not confirmed): {exc}; do not publish "
                "them again",
                receipts=[m.receipt for m in messages],
            ) from exc

    def cancelled(self, receipts: Sequence[CancelReceipt], now_ms: int) -> None:
        """Entries of the messages a cancel stopped (by id, or every live entry of a
        business key) move to cancelled. Raises ``ScheduleNotRecorded`` (the cancels
        themselves took) when the store cannot take it."""
        stopped = [r for r in receipts if r.cancelled]
        ids = [r.message_id for r in stopped if r.message_id is not None]
        keys = [r.key for r in stopped if r.message_id is None and r.key is not None]
        self._guarded(lambda: self._cancel(ids, keys, (), now_ms), receipts)

    def rescheduled(self, receipts: Sequence[RescheduleReceipt], now_ms: int) -> None:
        """Each new copy's entry moves to rescheduled at its due time and generation; a
        reschedule by business key also cancels the key's older entries."""

        def write() -> None:
            for r in receipts:
                if r.receipt is None:
                    continue
                new = r.receipt
                due = new.published_at_ms + new.tier_ms
                # To now (no tier): sent to its destinations at once, as a promote.
                to = State.RESCHEDULED if new.tier is not None else State.PROMOTED
                self.store.move(
                    [new.message_id], to, now_ms=now_ms, due_at_ms=due,
                    generation=r.generation, tier=new.tier,
                )  # fmt: skip
                if r.marks.message_id is None and r.marks.key is not None:
                    self._cancel([], [r.marks.key], (new.message_id,), now_ms)

        self._guarded(write, receipts)

    def _cancel(self, ids: list[str], keys: list[str], keep: Sequence[str], now_ms: int) -> None:
        live = WAITING | {State.PENDING, State.UNCONFIRMED}
        for key in keys:
            after = None
            while page := self.store.find(
                Query(business_key=key, states=live), after=after, limit=1000
            ):
                ids += [e.id for e in page if e.id not in keep]
                after = (page[-1].due_at_ms, page[-1].id)
        if ids:
            self.store.move(ids, State.CANCELLED, now_ms=now_ms)

    def _guarded(self, write: Callable[[], None], receipts: Sequence[object]) -> None:
        try:
            write()
        except DelayqError as exc:
            raise ScheduleNotRecorded(
                f"done on the broker and the consumers' store, but the schedule index "
                f"was not updated: {exc}",
                receipts=list(receipts),
            ) from exc


def _held_elsewhere(store: ScheduleStore, entry: Entry) -> bool:
    """Whether the entry a new record of ``entry``'s id left in place is live in
    another namespace (not a duplicate of this message: an id collision)."""
    held = store.get(entry.id)
    return held is not None and held.namespace != entry.namespace


def kept_headers(msg: OutgoingMessage) -> dict[str, Any] | None:
    """The publisher's own headers of ``msg`` (not delayq's, RabbitMQ's or the trace's),
    if JSON keeps them exactly and the body is one delayq encodes; else ``None``: the
    message cannot be sent again from the index alone."""
    if msg.content_type not in KEPT_CONTENT or msg.properties:
        return None
    own = {
        k: v
        for k, v in msg.headers.items()
        if not k.lower().startswith((HEADER_PREFIX, "x-")) and k != TRACEPARENT
    }
    try:
        return own if json.loads(json.dumps(own)) == own else None
    except (TypeError, ValueError):
        return None


def _failed(messages: Sequence[OutgoingMessage], error: BaseException | None) -> set[str]:
    if error is None:
        return set()
    if isinstance(error, PublishBatchError):
        return {messages[i].message_id for i in error.failures}
    return {m.message_id for m in messages}


@contextmanager
def recording(
    index: ScheduleIndex,
    topology: Topology,
    messages: Sequence[OutgoingMessage],
    now_ms: Callable[[], int],
) -> Iterator[None]:
    """Around a send of ``messages``: their entries pending before, moved after."""
    ids = index.before(topology, messages)
    try:
        yield
    except BaseException as exc:
        index.after(ids, messages, exc, now_ms())
        raise
    index.after(ids, messages, None, now_ms())


Settle = Callable[[int, OutgoingMessage, PublishError | None], None]
"""A stream's callback (:data:`delayq.links.Settle`): a message's index, the message, its
error (``None``: confirmed)."""


def recorded_stream(
    index: ScheduleIndex,
    topology: Topology,
    messages: Iterable[OutgoingMessage],
    settle: Settle,
    window: int,
    send: Callable[[Iterable[OutgoingMessage], Settle, int], None],
    now_ms: Callable[[], int],
) -> None:
    """``send`` a stream (``Publisher.send_many``) with its messages recorded, ``window``
    at a time, in one stream: each slice's entries are written pending as the stream
    pulls its first message (none of it is sent before), and moved once all of it settled
    (scheduled where confirmed, unconfirmed where not, or where ``send`` raised first),
    while the next slice is sent. So the stream's memory stays bounded as without the
    index, and its pipeline stays full. A pending write that fails ends the stream: what
    is in flight settles, nothing more is sent, and
    :class:`~delayq.errors.ScheduleNotRecorded` is raised; so does a move that fails,
    once the stream has ended the same way."""
    open_: dict[int, _Slice] = {}
    failed: list[BaseException] = []

    def pulled() -> Iterator[OutgoingMessage]:
        source = iter(messages)
        number = 0
        while not failed and (chunk := list(itertools.islice(source, window))):
            try:
                ids = index.before(topology, chunk)
            except ScheduleNotRecorded as exc:
                failed.append(exc)  # nothing of this slice is sent
                return
            open_[number] = _Slice(ids, chunk)
            number += 1
            yield from chunk  # a slice is sent whole: a failure ends the stream after it

    def told(i: int, msg: OutgoingMessage, error: PublishError | None) -> None:
        part = open_[i // window]
        if error is None:
            part.confirmed.add(msg.message_id)
        part.settled += 1
        settle(i, msg, error)
        if part.settled == len(part.chunk):
            del open_[i // window]
            try:
                index.settled(part.ids, part.chunk, part.confirmed, None, now_ms())
            except ScheduleNotRecorded as exc:  # never raised into the I/O path
                failed.append(exc)

    try:
        send(pulled(), told, window)
    except BaseException as exc:
        for part in open_.values():
            index.settled(part.ids, part.chunk, part.confirmed, exc, now_ms())
        raise
    for part in open_.values():  # a slice cut short: its unsent messages never settled
        index.settled(part.ids, part.chunk, part.confirmed, failed[0] if failed else None,
                      now_ms())  # fmt: skip
    if failed:
        raise failed[0]


class _Slice:
    """One window of a recorded stream: its recorded ids, its messages, what settled."""

    def __init__(self, ids: list[str], chunk: list[OutgoingMessage]) -> None:
        self.ids, self.chunk = ids, chunk
        self.confirmed: set[str] = set()
        self.settled = 0


@asynccontextmanager
async def arecording(
    index: ScheduleIndex,
    topology: Topology,
    messages: Sequence[OutgoingMessage],
    now_ms: Callable[[], int],
) -> AsyncIterator[None]:
    """:func:`recording` on asyncio: a store that blocks (``blocking = True``: a file,
    a server) is called in a thread, so the event loop never waits on it."""
    blocking = getattr(index.store, "blocking", True)

    async def call(step: Callable[..., object], *args: object) -> object:
        return await asyncio.to_thread(step, *args) if blocking else step(*args)

    ids = await call(index.before, topology, messages)
    assert isinstance(ids, list)
    try:
        yield
    except BaseException as exc:
        await call(index.after, ids, messages, exc, now_ms())
        raise
    await call(index.after, ids, messages, None, now_ms())
