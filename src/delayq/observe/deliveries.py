"""Watching what a consumer does: one event per settled delivery, for any number of observers.

Both consumers build a :class:`Settled` event when a delivery's fate is safe (the
ack is sent) and hand it to their observers: metrics, delivery records, logs or
the user's own. An observer runs on the consumer's thread or event loop, so it
must be quick and must not block; one that raises is logged and the consumer
goes on (an observer never decides a message's fate).

>>> class Count:
...     def __init__(self) -> None:
...         self.late = 0
...     def settled(self, event: Settled) -> None:
...         if (event.lateness_ms or 0) > 1000:
...             self.late += 1
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from delayq.consume.delivery import Action, Decision, Delivery
from delayq.errors import InvalidInput
from delayq.message.envelope import H_DELAY_MS, H_DUE_AT, H_PUBLISHED_AT, H_TIER, H_TIER_MS

__all__ = ["DeliveryObserver", "Observers", "Settled", "monotonic_ms"]

log = logging.getLogger("delayq.consumer")


def _int_header(headers: Mapping[str, Any], name: str) -> int | None:
    value = headers.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


@dataclass(frozen=True, slots=True)
class Settled:
    """One delivery whose fate is settled: what came in, what was decided, and when."""

    delivery: Delivery
    decision: Decision
    received_at_ms: int
    """When the consumer received the delivery (the consumer's clock, epoch ms)."""
    settled_at_ms: int
    """When its fate was safe: the republish (if any) confirmed and the ack sent."""
    handler_ms: float | None
    """How long the handler ran; ``None`` when it did not run (duplicate, undecodable,
    deferred)."""

    @property
    def queue(self) -> str:
        return self.delivery.queue

    @property
    def message_id(self) -> str | None:
        return self.delivery.message_id

    @property
    def routing_key(self) -> str:
        """The routing key the message was first published with."""
        return self.delivery.origin_routing_key

    @property
    def attempt(self) -> int:
        return self.delivery.attempt

    @property
    def action(self) -> Action:
        return self.decision.action

    @property
    def outcome(self) -> str:
        """``ack``, ``duplicate``, ``cancelled``, ``retry`` or ``dead-letter``."""
        return self.decision.action.value

    @property
    def reason(self) -> str:
        return self.decision.reason

    @property
    def requested_delay_ms(self) -> int | None:
        """The delay asked for at publish (or by the retry that sent this delivery)."""
        return _int_header(self.delivery.headers, H_DELAY_MS)

    @property
    def tier(self) -> str | None:
        """The tier the message waited in (``"immediate"`` for no delay); ``None`` for a
        message not published by delayq."""
        value = self.delivery.headers.get(H_TIER)
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        return value if isinstance(value, str) and value else None

    @property
    def tier_ms(self) -> int | None:
        return _int_header(self.delivery.headers, H_TIER_MS)

    @property
    def published_at_ms(self) -> int | None:
        return _int_header(self.delivery.headers, H_PUBLISHED_AT)

    @property
    def due_at_ms(self) -> int | None:
        """When the message was due: published at plus the requested delay."""
        due = _int_header(self.delivery.headers, H_DUE_AT)
        if due is not None:
            return due
        published, delay = self.published_at_ms, self.requested_delay_ms
        return None if published is None or delay is None else published + delay

    @property
    def lateness_ms(self) -> int | None:
        """Received minus due: how late the message reached its consumer (negative
        would mean early, which the tiers never do)."""
        due = self.due_at_ms
        return None if due is None else self.received_at_ms - due

    @property
    def retry_delay_ms(self) -> int | None:
        """For a retry, the delay until the next attempt."""
        if self.decision.action is not Action.RETRY or self.decision.message is None:
            return None
        return self.decision.message.receipt.delay_ms


class DeliveryObserver(Protocol):
    """Anything with a ``settled`` method: called once per settled delivery."""

    def settled(self, event: Settled) -> None: ...


class Observers:
    """The observers of one consumer; a failing observer is logged, never fatal."""

    __slots__ = ("_failed", "_observers")

    def __init__(self, observers: Iterable[DeliveryObserver] = ()) -> None:
        self._observers = tuple(observers)
        for observer in self._observers:
            if not callable(getattr(observer, "settled", None)):
                raise InvalidInput(f"observer {observer!r} has no settled(event) method")
        self._failed: set[int] = set()

    def __bool__(self) -> bool:
        return bool(self._observers)

    def __len__(self) -> int:
        return len(self._observers)

    def flush(self) -> None:
        """Let observers that buffer (delivery records) write what they hold.

        Calls each observer's ``flush()`` if it has one; the consumers call this
        when they stop. A failing flush is logged.
        """
        for observer in self._observers:
            flush = getattr(observer, "flush", None)
            if not callable(flush):
                continue
            try:
                if flush() is False:  # e.g. delivery records lost: the observer logged why
                    log.warning("observer %r did not flush everything it was given", observer)
            except Exception as exc:
                log.exception("observer %r failed to flush: %r", observer, exc)

    def emit(
        self,
        delivery: Delivery,
        decision: Decision,
        *,
        received_at_ms: int,
        settled_at_ms: int,
        handler_ms: float | None,
    ) -> None:
        """Build the event and hand it to every observer."""
        if not self._observers:
            return
        event = Settled(delivery, decision, received_at_ms, settled_at_ms, handler_ms)
        for observer in self._observers:
            try:
                observer.settled(event)
            except Exception as exc:
                # Logged once per observer (with its traceback), then counted silently:
                # an observer failing on every delivery must not flood the log.
                if id(observer) not in self._failed:
                    self._failed.add(id(observer))
                    log.exception(
                        "observer %r failed on %s (logged once): %r",
                        observer,
                        delivery.message_id,
                        exc,
                    )


def monotonic_ms() -> float:
    """A clock for handler durations (not the wall clock)."""
    return time.perf_counter() * 1000.0
