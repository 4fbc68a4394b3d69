"""Backpressure for the asyncio publisher: the waiting half of :mod:`delayq.message.inflight`.

Concurrent publishes (many tasks sharing one :class:`~delayq.aio.AsyncPublisher`)
reserve room before they hand anything to the link and give it back once their
confirms are in. Waiters are served first come, first served: a large batch at
the head is not overtaken forever by small publishes behind it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from delayq.errors import PublishBackpressure
from delayq.message.inflight import InFlight, InFlightLimit, refusal

__all__ = ["Admission"]


class Admission:
    """Room for unconfirmed messages, shared by one publisher's concurrent publishes."""

    def __init__(self, limit: InFlightLimit) -> None:
        self.book = InFlight(limit)
        self._waiters: deque[tuple[int, int, asyncio.Future[None]]] = deque()

    @property
    def limit(self) -> InFlightLimit:
        return self.book.limit

    @asynccontextmanager
    async def hold(self, count: int, size: int) -> AsyncIterator[bool]:
        """Room for ``count`` messages of ``size`` bytes in all, for the ``async with`` body,
        which gets whether it had to wait for it; raises
        :class:`~delayq.errors.PublishBackpressure` (nothing was sent) when none is free in
        time."""
        waited = await self.take(count, size)
        try:
            yield waited
        finally:
            self.give(count, size)

    def give(self, count: int, size: int) -> None:
        """Give back what :meth:`take` took (one call per take, however the send ended)."""
        self.book.give(count, size)
        if self._waiters:
            self._wake()

    def take_now(self, count: int, size: int) -> bool:
        """Take room if it is free now with no one waiting (no coroutine: a web app's
        publish pays this per request); whether it did. Else :meth:`take` waits."""
        if not self._waiters and self.book.fits(count, size):
            self.book.take(count, size)
            return True
        return False

    async def take(self, count: int, size: int) -> bool:
        """Take room, waiting for it if need be; returns whether it waited. Raises
        :class:`~delayq.errors.PublishBackpressure` (nothing was sent) when none is free
        in time. :meth:`hold` is the ``async with`` form; a caller of this one calls
        :meth:`give` once it is done, however it ended."""
        if not self._waiters and self.book.fits(count, size):
            self.book.take(count, size)
            return False
        limit = self.book.limit
        if limit.when_full == "raise":
            raise refusal(limit, count, waited=False)
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        entry = (count, size, waiter)
        self._waiters.append(entry)

        def give_up() -> None:
            # Not asyncio.wait_for: on Python 3.10/3.11 it may swallow a cancellation that
            # lands as the waiter is admitted.
            if not waiter.done():
                self._forget(entry)
                waiter.set_exception(refusal(limit, count, waited=True))

        timer = loop.call_later(limit.wait_ms / 1000, give_up)
        try:
            await waiter
        except PublishBackpressure:
            raise
        except BaseException:  # cancelled while waiting: room given to it goes back
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.book.give(count, size)
                self._wake()
            else:
                self._forget(entry)
            raise
        finally:
            timer.cancel()
        return True

    def _forget(self, entry: tuple[int, int, asyncio.Future[None]]) -> None:
        try:
            self._waiters.remove(entry)
        except ValueError:
            pass
        self._wake()  # the next in line may fit now that this one left the head

    def _wake(self) -> None:
        while self._waiters:
            count, size, waiter = self._waiters[0]
            if waiter.done():
                self._waiters.popleft()
                continue
            if not self.book.fits(count, size):
                return
            self._waiters.popleft()
            self.book.take(count, size)
            waiter.set_result(None)
