"""How much a publisher may have sent and not yet had confirmed: the pure core of backpressure.

A publisher faster than its broker must slow its caller down instead of holding
everything it was given: with confirms behind, every message handed to the
client library sits in its buffers (and, with a stalled broker, for as long as
the stall lasts). :class:`InFlightLimit` bounds what one publisher holds
unconfirmed, in messages and in bytes; what happens when a publish would pass
the bound is its ``when_full`` policy:

* ``"block"`` (the default): the publish waits until confirms free enough room,
  up to ``wait``; then it raises :class:`~delayq.errors.PublishBackpressure`
  and nothing of it was sent;
* ``"raise"``: it raises :class:`~delayq.errors.PublishBackpressure` at once.

Bytes are counted as the body's length plus :data:`OVERHEAD_BYTES` for the
properties and headers of each message (their size is bounded by the topology's
limits). A message larger than the whole byte bound is still sent, alone, when
nothing else is in flight: the bound slows publishers, it never forbids a
message the topology's limits allow.

:class:`InFlight` is the accounting the asyncio adapter waits on; a batch
reserves room for its *window* (what it keeps unconfirmed at once, see
:func:`batch_window`), not for the whole batch.

>>> limit = InFlightLimit(messages=3, bytes=10_000)
>>> book = InFlight(limit)
>>> book.fits(2, 600), book.take(2, 600), book.fits(2, 600)
(True, None, False)
>>> book.give(2, 600); book.fits(3, 900)
True
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from delayq.durations import Duration, format_ms, to_ms
from delayq.errors import InvalidInput, PublishBackpressure
from delayq.message.envelope import OutgoingMessage

__all__ = [
    "OVERHEAD_BYTES",
    "InFlight",
    "InFlightLimit",
    "batch_window",
    "limit_or_default",
    "refusal",
    "size_of",
]

OVERHEAD_BYTES = 256
"""What each message counts beyond its body: properties and delayq's headers."""

WhenFull = Literal["block", "raise"]


@dataclass(frozen=True)
class InFlightLimit:
    """The most one publisher holds sent but unconfirmed, and what a publish does at the bound.

    ``wait`` is a duration (``"30s"`` or a ``timedelta``; a bare number is refused,
    as everywhere in delayq); it applies to ``when_full="block"``.
    """

    messages: int = 10_000
    bytes: int = 64 * 1024 * 1024
    when_full: WhenFull = "block"
    wait: Duration = "60s"
    wait_ms: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("messages", "bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInput(
                    f"InFlightLimit.{name} must be a whole number of at least 1, got {value!r}"
                )
        if self.when_full not in ("block", "raise"):
            raise InvalidInput(
                f"InFlightLimit.when_full must be 'block' or 'raise', got {self.when_full!r}"
            )
        object.__setattr__(self, "wait_ms", to_ms(self.wait, what="InFlightLimit.wait"))


def limit_or_default(value: object) -> InFlightLimit:
    """A publisher's ``in_flight`` argument: an :class:`InFlightLimit`, or ``None`` for the
    default; anything else is refused (a bare ``1000`` does not say messages or bytes)."""
    if value is None:
        return InFlightLimit()
    if not isinstance(value, InFlightLimit):
        raise InvalidInput(
            f"in_flight must be an InFlightLimit (for example InFlightLimit(messages=1000, "
            f'bytes=16 * 2**20, when_full="raise")), got {type(value).__name__} {value!r}'
        )
    return value


def size_of(msg: OutgoingMessage) -> int:
    """What ``msg`` counts against the byte bound."""
    return len(msg.body) + OVERHEAD_BYTES


def check_window(window: object) -> int:
    """A ``publish_many`` ``window``: an int of 1 or more (refused before anything is
    built or sent)."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise InvalidInput(
            f"window is how many confirms a batch may wait for at once, an int of 1 or "
            f"more, not {window!r}"
        )
    return window


def batch_window(limit: InFlightLimit, batch: Sequence[OutgoingMessage], window: int) -> int:
    """How many of ``batch`` may be unconfirmed at once: ``window``, lowered so that
    ``window`` of its largest messages fit ``limit`` (never below 1)."""
    if not batch:
        return 1
    largest = max(size_of(m) for m in batch)
    return max(1, min(window, len(batch), limit.messages, limit.bytes // largest))


def refusal(limit: InFlightLimit, count: int, waited: bool) -> PublishBackpressure:
    """The error of a publish of ``count`` messages the bound did not admit."""
    what = "a message" if count == 1 else f"a batch of {count} messages"
    if waited:
        why = f"and confirms did not free room within {format_ms(limit.wait_ms)} (its wait)"
    else:
        why = "and its policy is to raise (when_full='raise')"
    return PublishBackpressure(
        f"the publisher holds as much unconfirmed as it may ({limit.messages:,} messages or "
        f"{limit.bytes:,} bytes) {why}: {what} was not sent. The broker confirms more slowly "
        "than it is published to; slow down, or raise the limit (in_flight=InFlightLimit(...))"
    )


class InFlight:
    """What one publisher holds unconfirmed; no I/O, no waiting (the adapters wait)."""

    def __init__(self, limit: InFlightLimit) -> None:
        self.limit = limit
        self.messages = 0
        self.bytes = 0

    def fits(self, count: int, size: int) -> bool:
        """Whether ``count`` more messages of ``size`` bytes in all stay within the bound;
        anything fits when nothing is in flight."""
        if self.messages == 0:
            return True
        return (
            self.messages + count <= self.limit.messages and self.bytes + size <= self.limit.bytes
        )

    def take(self, count: int, size: int) -> None:
        self.messages += count
        self.bytes += size

    def give(self, count: int, size: int) -> None:
        self.messages = max(0, self.messages - count)
        self.bytes = max(0, self.bytes - size)
