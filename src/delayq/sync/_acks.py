"""Acks for the blocking consumer, coalesced (the sync twin of :mod:`delayq.aio._acks`).

An ack by tag is a frame of its own, and pika's blocking channel writes out every
frame it is given at once (a send and two epoll updates): for a no-op handler
that costs about as much as receiving the delivery. So the feed thread does not
send an ack when a delivery is settled; it marks it in the channel's
:class:`AckLine`, and at the start of each turn of its loop (before it waits
again) sends what the line gives: once :func:`ack_batch` acks are due (a quarter
of the prefetch) or the first has waited :data:`ACK_DELAY_S`, one
``basic.ack(multiple=True)`` for the longest run of acked deliveries at the head
of the channel's outstanding ones.

What a ``multiple`` ack covers is every delivery up to its tag on the channel, so
it never passes one that is not acked here: a delivery whose handler runs, one
not started yet, one that goes back with the channel (a handler that raised
``SystemExit``, a delivery dropped at the end of a stop's grace). A nack (a
delivery put back) is sent at once and leaves the line then, ahead of any later
ack that could cover its tag, which the broker no longer counts by then. Acked
deliveries behind one still unsettled wait up to :data:`ACK_DELAY_S` more for it,
then go one ack each: a slow handler never holds the others' acks (and the
prefetch credit they hold) for long.

An ack is only ever marked here once the delivery's fate is safe (its handler
returned, its key recorded, its retry or dead letter confirmed): coalescing
delays it (by twice ``ACK_DELAY_S`` at most), never sends it early. A connection
lost meanwhile returns those deliveries to the queue with the unsettled ones, as
any in flight: the idempotency store skips them as duplicates. A line is one
channel's: a delivery of a channel since lost is never acked on the new one (its
tag would name another delivery there).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["ACK_DELAY_S", "AckLine", "ack_batch"]

ACK_DELAY_S = 0.01
"""How long acked deliveries behind an unsettled one wait before going one by one (s)."""


def ack_batch(prefetch: int) -> int:
    """How many acks are sent at once under ``prefetch``: a quarter of it, so the broker
    keeps three quarters of its credit while they gather (as the asyncio consumer's)."""
    return max(1, prefetch // 4)


class AckLine:
    """One channel's outstanding deliveries, in delivery order, and which are acked."""

    __slots__ = ("_behind", "_clock", "_delay_s", "_due", "_line", "_since", "batch")

    def __init__(
        self,
        batch: int = 1,
        delay_s: float = ACK_DELAY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.batch = batch
        """Acked deliveries sent at once (fewer wait up to ``delay_s`` for others)."""
        self._delay_s = delay_s
        self._clock = clock
        self._line: OrderedDict[int, bool] = OrderedDict()
        """Each tracked delivery not yet sent an ack or nack for: whether it is acked."""
        self._due = 0
        """How many of them are acked (and their ack not yet sent)."""
        self._since = 0.0
        """Since when the acks due wait (the first of them, or the last :meth:`take` that
        left some behind an unsettled delivery)."""
        self._behind = False
        """Whether acks due wait behind an unsettled delivery."""

    def __len__(self) -> int:
        return len(self._line)

    @property
    def due(self) -> int:
        """Acked deliveries whose ack is not sent yet."""
        return self._due

    def track(self, tag: int) -> None:
        """A delivery arrived (they arrive in delivery-tag order)."""
        self._line[tag] = False

    def ack(self, tag: int) -> bool:
        """Mark ``tag`` acked, to go with a later :meth:`take`. ``False`` when it is not an
        outstanding delivery of this line (the caller acks it alone, at once)."""
        line = self._line
        if line.get(tag) is not False:
            return False
        line[tag] = True
        if not self._due:
            self._since = self._clock()
        self._due += 1
        return True

    def drop(self, tag: int) -> None:
        """``tag`` is nacked now (its frame goes before any later ack): it leaves the line,
        so the deliveries around it may be acked together again."""
        if self._line.pop(tag, False):
            self._due -= 1
            if not self._due:
                self._behind = False

    def take(self, now: float, *, waited: bool = False) -> tuple[int | None, list[int]]:
        """What to send now: the last tag of the acked run at the head of the line (for one
        ``multiple`` ack, ``None`` if there is none) and acked tags behind an unsettled
        delivery (one ack each). Nothing until ``batch`` acks are due or the first has
        waited ``delay_s``; those behind an unsettled delivery go after waiting ``delay_s``
        there. All of them if ``waited``. What is returned leaves the line."""
        due = self._due
        if not due or not (waited or due >= self.batch or now - self._since >= self._delay_s):
            return None, []
        line = self._line
        last: int | None = None
        for tag, acked in line.items():
            if not acked:
                break
            last = tag
            due -= 1
        if last is not None:
            while True:
                tag, _ = line.popitem(last=False)
                if tag == last:
                    break
        singles: list[int] = []
        if due and (waited or (self._behind and now - self._since >= self._delay_s)):
            singles = [tag for tag, acked in line.items() if acked]
            for tag in singles:
                del line[tag]
            due = 0
        if due and not self._behind:  # they wait behind one still unsettled from now
            self._behind, self._since = True, now
        elif not due:
            self._behind = False
        self._due = due
        return last, singles

    def wait_s(self, now: float) -> float | None:
        """How long until the acks due are sent (``None``: none is due; the feed thread
        may wait for the broker as long as it likes)."""
        if not self._due:
            return None
        return max(0.0, self._since + self._delay_s - now)
