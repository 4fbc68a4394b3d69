"""Acks for the asyncio consumer, coalesced.

A no-op handler's delivery costs about as much to ack as to receive, for the
client and for the broker: each ack frame is a write to the socket (on a local
broker the kernel delivers it in the writer's time) and, on a quorum queue, one
settle command in the queue's Raft log. So settled deliveries are acked
together: once ``batch`` of them wait (a quarter of the prefetch: the broker
never runs out of credit) or ``delay_s`` after the first one, whichever comes
first. The longest run of settled deliveries at the head of the channel's
outstanding ones goes with one ``basic.ack(multiple=True)``, any settled ones
behind a still-running handler one by one (so a slow handler never holds up the
acks of the others).

What a ``multiple`` ack may cover is the whole point: every delivery up to its
tag on the channel. So it never passes a delivery that is not settled: one whose
handler runs, one whose nack is not yet written (a nack leaves the line only once
it is in the outbox, ahead of any ack that could cover it), one *forgotten* (its
task was cancelled: it must go back to the queue when the channel closes, so it
blocks the line for good and the acks behind it go one by one).

An ack is only ever sent after the delivery's fate is safe (its retry or dead
letter confirmed, its key recorded): coalescing delays it by at most ``delay_s``,
never sends it early. A connection lost meanwhile returns those deliveries to
the queue with the unsettled ones (a prefetch's worth at most): the idempotency
store skips them as duplicates (without a store they run again, as any
delivery in flight at a connection loss does). Every frame leaves through one outbox, in order, one
sender at a time: two multiple acks written out of order would name a tag the
broker has already forgotten, which closes the channel.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, deque

from delayq.links import Settleable

__all__ = ["ACK_DELAY_S", "AckCoalescer", "Settleable", "ack_batch"]

log = logging.getLogger("delayq.consumer")

ACK_DELAY_S = 0.01
"""The longest a settled delivery waits for others to be acked with (seconds)."""


def ack_batch(prefetch: int) -> int:
    """How many settled deliveries are acked at once under ``prefetch``: a quarter of it,
    so the broker keeps three quarters of its credit while they gather."""
    return max(1, prefetch // 4)


_MULTIPLE, _SINGLE, _REQUEUE, _DROP = range(4)
"""What the outbox sends: an ack covering everything up to the tag, an ack of the tag
alone, a nack that requeues, a nack that does not."""


class AckCoalescer:
    """Tracks one channel's outstanding deliveries in delivery order."""

    def __init__(self, batch: int = 1, delay_s: float | None = None) -> None:
        self.batch = batch
        """Settled deliveries that are acked at once (the rest wait up to ``delay_s``)."""
        self._delay_s = ACK_DELAY_S if delay_s is None else delay_s
        self._timer: asyncio.TimerHandle | None = None
        self._line: OrderedDict[int, Settleable] = OrderedDict()
        """Every delivery tracked and not yet in the outbox, in delivery order."""
        self._to_ack: dict[int, Settleable] = {}
        """Settled during this loop turn."""
        self._scheduled = False
        self._outbox: deque[tuple[int, Settleable]] = deque()
        self._sender: asyncio.Task[None] | None = None
        self.frames = 0
        """Frames written (acks and nacks): with :attr:`settled`, how well acks coalesce."""
        self.settled = 0
        """Deliveries acked or nacked through this coalescer."""

    def track(self, message: Settleable) -> None:
        """Call when a delivery arrives (deliveries arrive in delivery-tag order)."""
        tag = message.delivery_tag
        if tag is not None:
            self._line[tag] = message

    def ack(self, message: Settleable) -> None:
        """Ack ``message`` at the end of this loop turn."""
        tag = message.delivery_tag
        if tag is None or self._line.get(tag) is not message:
            # Not this channel's (an earlier channel's: the ack fails, the broker
            # requeued it already), or untracked: alone, never as a multiple ack.
            self._post(_SINGLE, message)
            return
        to_ack = self._to_ack
        to_ack[tag] = message
        if self._scheduled:
            return
        if len(to_ack) >= self.batch:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._delay_s, self._flush)

    async def nack(self, message: Settleable, *, requeue: bool) -> None:
        """Return ``message`` to the queue (``requeue``) or drop it, now; the acks go on."""
        tag = message.delivery_tag
        if tag is not None and self._line.get(tag) is message:
            self._to_ack.pop(tag, None)
            # In the outbox before any ack that could cover it: it may leave the line,
            # and the deliveries behind it may be acked together again.
            self._post(_REQUEUE if requeue else _DROP, message)
            del self._line[tag]
        else:
            self._post(_REQUEUE if requeue else _DROP, message)

    def forget(self, message: Settleable) -> None:
        """A delivery that will never be settled here (its handler was cancelled): the
        broker requeues it when the channel closes. It stays in the line, unsettled, so
        no multiple ack covers it; a settled one of it is dropped."""
        tag = message.delivery_tag
        if tag is not None and self._line.get(tag) is message:
            self._to_ack.pop(tag, None)

    def _flush(self) -> None:
        self._scheduled = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        line, to_ack = self._line, self._to_ack
        last: Settleable | None = None
        while line:
            tag = next(iter(line))
            message = to_ack.pop(tag, None)
            if message is None:
                break
            line.popitem(last=False)
            last = message
            self.settled += 1
        if last is not None:
            self._post(_MULTIPLE, last)
        for tag, message in to_ack.items():  # behind a handler still running
            del line[tag]
            self._post(_SINGLE, message)
        to_ack.clear()

    def _post(self, kind: int, message: Settleable) -> None:
        outbox = self._outbox
        if kind is _MULTIPLE and outbox and outbox[-1][0] is _MULTIPLE:
            outbox[-1] = (kind, message)  # nothing between them: the later covers both
        else:
            outbox.append((kind, message))
        if kind is not _MULTIPLE:
            self.settled += 1
        if self._sender is None:
            self._sender = asyncio.get_running_loop().create_task(self._send())

    async def _send(self) -> None:
        outbox = self._outbox
        try:
            while outbox:
                kind, message = outbox.popleft()
                self.frames += 1
                try:
                    if kind is _MULTIPLE:
                        await message.ack(multiple=True)
                    elif kind is _SINGLE:
                        await message.ack()
                    else:
                        await message.nack(requeue=kind is _REQUEUE)
                except Exception as exc:
                    # The channel is gone: the broker requeues every unacked delivery.
                    log.warning("settling delivery %s failed: %r", message.delivery_tag, exc)
        finally:
            self._sender = None

    def abandon(self) -> None:
        """The channel is gone: nothing more is sent for it (the broker requeued all)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._to_ack.clear()
        self._line.clear()

    async def drain(self) -> None:
        """Send what is due now and wait for it (before closing the channel)."""
        if self._to_ack:
            self._flush()
        while (sender := self._sender) is not None:
            await asyncio.wait((sender,))  # never raises, even if it was cancelled
            if self._sender is sender:  # cancelled before it ran
                self._sender = None
