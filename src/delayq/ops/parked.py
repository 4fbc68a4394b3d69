"""Parked messages (a DLQ or ``<ns>.unrouted``): summaries and replays, as pure code."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from delayq.consume.delivery import (
    H_DEAD_LETTER_REASON,
    H_ERROR_MESSAGE,
    H_ERROR_TYPE,
    H_FAILED_AT,
    Delivery,
)
from delayq.consume.planner import republished
from delayq.errors import InvalidInput
from delayq.intake.delay import X_DELAY
from delayq.message.envelope import (
    H_GENERATION,
    H_PUBLISHED_AT,
    HEADER_PREFIX,
    OutgoingMessage,
    envelope_headers,
)
from delayq.observe.carrier import replay_history

__all__ = [
    "DEATH_REASONS",
    "H_REPLAYED_AT",
    "Death",
    "ParkedMessage",
    "find_id",
    "may_name",
    "replay_message",
]

H_REPLAYED_AT = "delayq-replayed-at"

DEATH_REASONS = {
    "delivery_limit": "delivery limit",
    "expired": "expired",
    "maxlen": "max length",
    "rejected": "rejected",
}
"""RabbitMQ's dead-letter reasons (``x-death``), as ``dlq list`` words them."""


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


@dataclass(frozen=True, slots=True)
class Death:
    """One ``x-death`` entry: the broker dead-lettered the message ``count`` times from
    ``queue`` for ``reason`` (``delivery_limit``, ``expired``, ``maxlen``, ``rejected``)."""

    reason: str
    queue: str
    count: int

    @property
    def label(self) -> str:
        return f"{DEATH_REASONS.get(self.reason, self.reason)} ({self.queue})"


def deaths(headers: Any) -> list[Death]:
    """The ``x-death`` entries, most recent first (as RabbitMQ orders them)."""
    entries = headers.get("x-death") if hasattr(headers, "get") else None
    if not isinstance(entries, list):
        return []
    found = []
    for entry in entries:
        if isinstance(entry, dict):
            count = entry.get("count")
            found.append(
                Death(
                    _text(entry.get("reason")),
                    _text(entry.get("queue")),
                    int(count) if isinstance(count, int) else 1,
                )
            )
    return found


@dataclass(frozen=True, slots=True)
class ParkedMessage:
    """One parked message as ``delayq dlq list`` shows it."""

    delivery: Delivery
    timestamp_s: int | None = None
    dead_letters_of: str | None = None
    """The queue that dead-letters into this one (a DLQ's destination): its ``x-death``
    entry tells why the broker parked a message delayq did not dead-letter itself."""

    @property
    def death(self) -> Death | None:
        """Why the broker dead-lettered the message here, if it did (``None``: delayq did,
        or the queue does not take dead letters, like ``<ns>.unrouted``)."""
        if self.dead_letters_of is None or H_DEAD_LETTER_REASON in self.delivery.headers:
            return None
        # Only the destination's entry: the message's earlier deaths (a tier's TTL
        # expiry, which is how every delayed message reaches its destination) are not
        # why it is parked, and x-first-death-* names exactly that first tier expiry.
        mine = [d for d in deaths(self.delivery.headers) if d.queue == self.dead_letters_of]
        return mine[0] if mine else None

    @property
    def message_id(self) -> str:
        return self.delivery.message_id or "(none)"

    @property
    def attempts(self) -> int:
        return self.delivery.attempt

    @property
    def reason(self) -> str:
        own = _text(self.delivery.headers.get(H_DEAD_LETTER_REASON))
        death = self.death
        return own or (death.label if death is not None else "-")

    @property
    def error(self) -> str:
        kind = _text(self.delivery.headers.get(H_ERROR_TYPE)).rsplit(".", 1)[-1]
        message = _text(self.delivery.headers.get(H_ERROR_MESSAGE))
        return f"{kind}: {message}" if kind else message or "-"

    def parked_at_ms(self) -> int | None:
        headers = self.delivery.headers
        value = headers.get(H_FAILED_AT)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        # Dead-lettered by the broker: when, by its latest x-death entry (a plugin-style
        # publisher's timestamp says when it was published, days before, or nothing).
        entries = headers.get("x-death")
        if isinstance(entries, list) and entries and isinstance(entries[0], dict):
            when = entries[0].get("time")
            if isinstance(when, datetime):
                return int(when.timestamp() * 1000)
        value = headers.get(H_PUBLISHED_AT)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        return None if self.timestamp_s is None else self.timestamp_s * 1000

    def age_ms(self, now_ms: int) -> int | None:
        at = self.parked_at_ms()
        return None if at is None else max(0, now_ms - at)


def may_name(given: str, message_id: str) -> bool:
    """``given`` is ``message_id``, or a prefix of it (see :func:`find_id`)."""
    prefix = given.removesuffix("…").removesuffix("...")
    return given == message_id or (bool(prefix) and message_id.startswith(prefix))


def find_id(given: str, ids: Iterable[str]) -> str | None:
    """The one id of ``ids`` that ``given`` names: itself, else the id it begins.

    ``dlq list`` cuts a long id to its head and ``…`` (``...`` when retyped): that form,
    or any other prefix, names the id it begins. ``None``: it names none. A prefix that
    begins several ids is refused (:class:`~delayq.errors.InvalidInput`) with them.
    """
    distinct = list(dict.fromkeys(ids))
    if given in distinct:
        return given
    matches = [i for i in distinct if may_name(given, i)]
    if len(matches) > 1:
        shown = ", ".join(matches[:10]) + (", ..." if len(matches) > 10 else "")
        raise InvalidInput(
            f"message id {given!r} is ambiguous: it begins {len(matches)} parked ids "
            f"({shown}); give more of it"
        )
    return matches[0] if matches else None


def replay_message(
    parked: Delivery, *, exchange: str, routing_key: str, now_ms: int
) -> OutgoingMessage:
    """The parked message, sent again: same id and body, attempt counter reset to 1,
    failure headers dropped (``delayq-replayed-at`` says when; ``delayq-replays`` and
    ``delayq-previous-attempts`` how often it was replayed and the attempts it used up
    before: see :mod:`delayq.observe.carrier`). A rescheduled copy keeps its generation:
    replayed, it is that copy again, not an older one (which its own mark would cancel).
    The broker's ``x-`` headers are dropped, but ``x-delay``: the publisher's, which an
    intake's bridge reads again when the message is replayed through the intake."""
    headers: dict[str, Any] = {
        k: v
        for k, v in parked.headers.items()
        if not k.lower().startswith(HEADER_PREFIX)
        and (not k.lower().startswith("x-") or k.lower() == X_DELAY)
    }
    headers.update(envelope_headers(0, None, 0, now_ms, 1, parked.origin_routing_key))
    headers[H_REPLAYED_AT] = now_ms
    headers.update(replay_history(parked))
    if H_GENERATION in parked.headers:
        headers[H_GENERATION] = parked.headers[H_GENERATION]
    return republished(parked, exchange, routing_key, headers, now_ms)
