"""A DLQ replay kept in the schedule index (``delayq dlq replay --schedule-index``).

A replayed message is sent to its queue at once, so it is not *scheduled* in a tier, but
its entry said it ended in a dead-letter queue (or it had none), and the index is where an
operator looks for what became of it. Each copy is written afresh, ``pending`` before it
is sent (due now, no tier, the labels and business key of the entry its id had, else the
index's), and moved to ``scheduled`` once the broker confirmed it, or to
``unconfirmed``. From there the consumers' reporter moves it as for any message: it
leaves the waiting view once a consumer took it.

An id whose entry still waits (a message dead-lettered while no reporter ran) keeps that
entry, as a publish of an id that waits does: the reporter moves it when the copy is
handled.

If the pending write fails, the copy is not sent (the message stays parked) and the
replay stops with :class:`~delayq.errors.ScheduleNotRecorded`. If the move after the
confirm fails, the copy *was* sent and its parked message removed: the replay goes on,
and the id is reported as not recorded (its entry stays pending until the reporter
moves it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import MappingProxyType

from delayq.errors import ScheduleNotRecorded, StoreError
from delayq.message.envelope import H_GENERATION, OutgoingMessage, epoch_ms
from delayq.schedule.entry import Entry, State, unchecked
from delayq.schedule.record import ScheduleIndex, kept_headers
from delayq.topology.model import Topology

__all__ = ["ReplayRecord"]

log = logging.getLogger("delayq.schedule")


class ReplayRecord:
    """What a replay writes into ``index`` for ``topology``'s messages."""

    def __init__(self, index: ScheduleIndex, topology: Topology) -> None:
        self.index = index
        self.topology = topology

    def replayed(
        self,
        copy: OutgoingMessage,
        routing_key: str,
        destinations: tuple[str, ...],
        send: Callable[[], None],
    ) -> bool:
        """Record ``copy`` around ``send`` (its publish and the parked message's ack):
        ``False`` when the copy was sent but its entry could not be moved on (logged)."""
        try:
            ids = self.index.add_pending([self.entry(copy, routing_key, destinations)])
        except ScheduleNotRecorded:
            raise
        except StoreError as exc:  # the look-up of the entry its id had
            raise ScheduleNotRecorded(
                f"the schedule index could not be read: {exc}; nothing was sent"
            ) from exc
        try:
            send()
        except BaseException as exc:
            self.index.after(ids, [copy], exc, epoch_ms())  # logs a failed move: exc wins
            raise
        try:
            self.index.after(ids, [copy], None, epoch_ms())
        except ScheduleNotRecorded as exc:
            log.error("replayed %s, but %s", copy.message_id, exc)
            return False
        return True

    def parked_again(self, ids: list[str]) -> list[str]:
        """Copies the broker routed straight back to their parking queue (an unrouted
        message no binding takes yet): their entries move to dead-lettered, parked again.
        Returns those it could not move (logged)."""
        if not ids:
            return []
        try:
            self.index.store.move(ids, State.DEAD_LETTERED, now_ms=epoch_ms())
        except StoreError as exc:
            log.error("%d replayed copies came back parked, but their entries stay: %s",
                      len(ids), exc)  # fmt: skip
            return list(ids)
        return []

    def entry(self, copy: OutgoingMessage, routing_key: str, to: tuple[str, ...]) -> Entry:
        """The pending entry of a replayed ``copy`` sent under ``routing_key`` to ``to``."""
        index, now = self.index, copy.receipt.published_at_ms
        held = index.store.get(copy.message_id)
        if held is not None and held.namespace == self.topology.namespace:
            labels, business_key = held.labels, held.business_key
        else:  # none, or another namespace's (refused by add_pending, as for a publish)
            labels = index.labels_for(copy)
            business_key = index.business_key_of(copy)
        keep = index.keep_bodies and len(copy.body) <= index.keep_bodies
        kept = kept_headers(copy) if keep else None
        content_type: str | None = copy.content_type
        if held is not None and held.kept and held.body == copy.body:  # kept before: still
            kept, content_type = dict(held.headers or {}), held.content_type
        generation = copy.headers.get(H_GENERATION, 0)
        return unchecked(
            id=copy.message_id,
            namespace=self.topology.namespace,
            routing_key=routing_key,
            due_at_ms=now,
            tier="",
            published_at_ms=now,
            size=len(copy.body),
            destinations=to,
            business_key=business_key,
            labels=labels,
            state=State.PENDING,
            generation=generation if isinstance(generation, int) else 0,
            changed_at_ms=now,
            body=None if kept is None else copy.body,
            content_type=None if kept is None else content_type,
            headers=None if kept is None else MappingProxyType(kept),
            delay_ms=0,  # sent at once
        )
