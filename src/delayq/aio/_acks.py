"""Acks for the asyncio consumer, coalesced per event-loop turn.

A no-op handler's delivery costs about as much to ack as to receive. The
deliveries settled during one turn of the event loop are acked together: the
longest run of settled deliveries at the head of the channel's outstanding ones
with one ``basic.ack(multiple=True)``, any settled ones behind a still-running
handler one by one (so a slow handler never holds up the acks of the others).
An ack is only ever sent after the delivery's fate is safe (its retry or dead
letter confirmed, its key recorded): coalescing delays it by one loop turn,
never sends it early. Nacks go out at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Coroutine
from typing import Any

from delayq.links import Settleable

__all__ = ["AckCoalescer", "Settleable"]

log = logging.getLogger("delayq.consumer")


class AckCoalescer:
    """Tracks one channel's outstanding deliveries in delivery order."""

    def __init__(self) -> None:
        self._outstanding: OrderedDict[int, Settleable] = OrderedDict()
        self._to_ack: dict[int, Settleable] = {}
        self._scheduled = False
        self._sending: set[asyncio.Task[None]] = set()

    def track(self, message: Settleable) -> None:
        """Call when a delivery arrives (deliveries arrive in delivery-tag order)."""
        tag = message.delivery_tag
        if tag is not None:
            self._outstanding[tag] = message

    def ack(self, message: Settleable) -> None:
        """Ack ``message`` at the end of this loop turn."""
        tag = message.delivery_tag
        if tag is None or self._outstanding.get(tag) is not message:
            self._send(message.ack())  # from an earlier channel: it fails, the broker requeues
            return
        self._to_ack[tag] = message
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    async def nack(self, message: Settleable, *, requeue: bool) -> None:
        self.forget(message)
        await message.nack(requeue=requeue)

    def forget(self, message: Settleable) -> None:
        """A delivery that will never be settled here (its handler was cancelled at
        shutdown): the broker requeues it when the channel closes."""
        tag = message.delivery_tag
        if tag is not None and self._outstanding.get(tag) is message:
            del self._outstanding[tag]

    def _flush(self) -> None:
        self._scheduled = False
        last: Settleable | None = None
        outstanding, to_ack = self._outstanding, self._to_ack
        while outstanding:
            tag = next(iter(outstanding))
            if tag not in to_ack:
                break
            outstanding.popitem(last=False)
            last = to_ack.pop(tag)
        if last is not None:
            self._send(last.ack(multiple=True))
        for tag, message in to_ack.items():  # behind a handler still running
            outstanding.pop(tag, None)
            self._send(message.ack())
        to_ack.clear()

    def _send(self, ack: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(ack)
        self._sending.add(task)
        task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task[None]) -> None:
        self._sending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # The channel is gone: the broker requeues every unacked delivery.
            log.warning("ack failed: %r", task.exception())

    async def drain(self) -> None:
        """Send what is due now and wait for it (before closing the channel)."""
        if self._to_ack:
            self._flush()
        if self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)
