"""The memory broker's deliveries: consumers attached, messages handed out and settled, and
the run loop that moves the virtual clock from one due message to the next.

:class:`~delayq.testing.MemoryBroker` owns one :class:`Dispatch` and exposes it through
``subscribe``, ``ack``, ``nack``, ``advance`` and the ``run_until*`` methods.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from delayq.errors import DelayqError, InvalidInput
from delayq.testing.clock import VirtualClock
from delayq.testing.entities import Entities
from delayq.testing.model import Queue, StoredMessage

__all__ = ["MAX_STEPS", "Dispatch", "NoProgress", "Subscriber"]

MAX_STEPS = 1_000_000
"""Deliveries and expiries in one call before the broker gives up (a handler loop)."""


class NoProgress(DelayqError):
    """The broker ran ``MAX_STEPS`` steps in one call: messages go round in a loop."""


class Subscriber(Protocol):
    """A consumer attached to the broker (the memory adapters implement it)."""

    queue: str
    is_async: bool

    def deliver(self, tag: int, message: StoredMessage) -> None: ...

    async def adeliver(self, tag: int, message: StoredMessage) -> None: ...


@dataclass
class _Unacked:
    subscriber: Subscriber
    queue: Queue
    message: StoredMessage


class Dispatch:
    """Who consumes what, what they hold unacked, and the loop that delivers."""

    def __init__(self, world: Entities, clock: VirtualClock) -> None:
        self._world = world
        self.clock = clock
        self.subscribers: list[Subscriber] = []
        self.unacked: dict[int, _Unacked] = {}
        self._tags = itertools.count(1)
        self._driving = False

    def subscribe(self, subscriber: Subscriber) -> None:
        """Attach a consumer: it receives ``subscriber.queue``'s messages when the broker runs."""
        self._world.queue(subscriber.queue)
        if subscriber not in self.subscribers:
            self.subscribers.append(subscriber)

    def unsubscribe(self, subscriber: Subscriber) -> None:
        """Detach a consumer; what it holds unacked goes back to its queue."""
        if subscriber in self.subscribers:
            self.subscribers.remove(subscriber)
        for tag in [t for t, u in self.unacked.items() if u.subscriber is subscriber]:
            self.nack(tag, requeue=True)

    def ack(self, tag: int, *, multiple: bool = False) -> None:
        entry = self.unacked.pop(tag, None)
        if entry is None:
            raise InvalidInput(f"unknown delivery tag {tag} (acked twice?)")
        if multiple:
            for other in [
                t for t, u in self.unacked.items() if t < tag and u.subscriber is entry.subscriber
            ]:
                del self.unacked[other]

    def nack(self, tag: int, *, requeue: bool) -> None:
        entry = self.unacked.pop(tag, None)
        if entry is None:
            raise InvalidInput(f"unknown delivery tag {tag} (settled twice?)")
        queue, message = entry.queue, entry.message
        if not requeue:
            self._world.dead_letter(queue, message, "rejected")
            return
        limit = queue.delivery_limit
        if limit is not None and message.deliveries > limit:
            self._world.dead_letter(queue, message, "delivery_limit")
            return
        queue.messages.appendleft(message)  # back at the head, as RabbitMQ requeues

    def idle(self) -> bool:
        return self.next_due() is None and self.next_ready() is None

    def run_sync(self, steps: Iterator[tuple[Subscriber, int, StoredMessage]]) -> None:
        if any(s.is_async for s in self.subscribers):
            raise InvalidInput(
                "async consumers are attached: use `await broker.advance_async(...)` "
                "(or run_until_idle_async / run_until_async)"
            )
        with self.driving_guard():
            for subscriber, tag, message in steps:
                try:
                    subscriber.deliver(tag, message)
                finally:
                    self.requeue_unsettled(tag)

    async def run_async(self, steps: Iterator[tuple[Subscriber, int, StoredMessage]]) -> None:
        with self.driving_guard():
            for subscriber, tag, message in steps:
                try:
                    if subscriber.is_async:
                        await subscriber.adeliver(tag, message)
                    else:
                        subscriber.deliver(tag, message)
                finally:
                    self.requeue_unsettled(tag)

    def requeue_unsettled(self, tag: int) -> None:
        if tag in self.unacked:  # a consumer that never settles: as if its channel closed
            self.nack(tag, requeue=True)

    @contextmanager
    def driving_guard(self) -> Iterator[None]:
        """One driver at a time: a handler that calls ``advance`` would re-enter it."""
        if self._driving:
            raise InvalidInput(
                "the memory broker is already running (advance called from a handler?)"
            )
        self._driving = True
        try:
            yield
        finally:
            self._driving = False

    def steps(
        self,
        until_ms: int,
        *,
        idle_stops: bool = False,
        done: Callable[[], bool] | None = None,
    ) -> Iterator[tuple[Subscriber, int, StoredMessage]]:
        """Deliveries to perform, in due order, as time moves up to ``until_ms``."""
        for _ in range(MAX_STEPS):
            if done is not None and done():
                return
            ready = self.next_ready()
            if ready is not None:
                subscriber, queue = ready
                message = queue.messages.popleft()
                message.deliveries += 1
                tag = next(self._tags)
                self.unacked[tag] = _Unacked(subscriber, queue, message)
                yield subscriber, tag, message
                continue
            due = self.next_due()
            if due is None or due[0] > until_ms:
                if not idle_stops and done is None:
                    self.clock.move_to(max(until_ms, self.clock.now_ms()))
                return
            due_ms, _, queue = due
            self.clock.move_to(max(due_ms, self.clock.now_ms()))
            self._world.dead_letter(queue, queue.messages.popleft(), "expired")
        raise NoProgress(
            f"the memory broker ran {MAX_STEPS} steps without getting quiet: does a handler "
            "retry forever with no delay, or do messages dead-letter in a cycle?"
        )

    def next_due(self) -> tuple[int, int, Queue] | None:
        best: tuple[int, int, Queue] | None = None
        for queue in self._world.queues.values():
            due = queue.head_due_ms()
            if due is None:
                continue
            candidate = (due, queue.messages[0].seq, queue)
            if best is None or candidate[:2] < best[:2]:
                best = candidate
        return best

    def next_ready(self) -> tuple[Subscriber, Queue] | None:
        """The consumer for the oldest message among the queues with consumers."""
        best: tuple[int, Subscriber, Queue] | None = None
        for subscriber in self.subscribers:
            queue = self._world.queues.get(subscriber.queue)
            if queue is None or not queue.messages:
                continue
            seq = queue.messages[0].seq
            if best is None or seq < best[0]:
                best = (seq, subscriber, queue)
        if best is None:
            return None
        _, subscriber, queue = best
        # Round robin between the consumers of one queue.
        self.subscribers.remove(subscriber)
        self.subscribers.append(subscriber)
        return subscriber, queue
