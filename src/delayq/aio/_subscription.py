"""The subscription half of an asyncio feed: one consumer tag, and what changes it.

Both asyncio feeds (the frame feed, :mod:`delayq.aio._framefeed`, and the aio-pika
one, :mod:`delayq.aio._feed`) subscribe once per opening, subscribe again with a
wider prefetch after the consumer's cautious start, and cancel before a graceful
stop. What must hold in every one of them is here: a cancel the feed sends
itself is never taken for the broker's (the tag is dropped first); a resubscribe
that finds the feed unsubscribed or reopened meanwhile does not consume again on
the old channel; ``consuming`` stays true until the broker confirmed a cancel
(deliveries may arrive until then). The feeds say how to cancel, set the
prefetch and consume on their client, and which of its errors mean the channel
is gone.
"""

from __future__ import annotations

import logging

from delayq.links import FeedLost

__all__ = ["Subscription"]

log = logging.getLogger("delayq.consumer")


class Subscription:
    """A feed's consumer tag and its life; subclasses implement the four hooks."""

    _lost_errors: tuple[type[BaseException], ...] = (Exception,)
    """The client's errors that mean the channel or connection is gone."""

    def __init__(self) -> None:
        self._tag: str | None = None
        self._subscribed = False
        self._consuming = False  # until the broker confirmed a cancel

    def _channel_now(self) -> object | None:
        """What the feed consumes on now (``None`` when closed): a reopening replaces it."""
        raise NotImplementedError

    async def _cancel(self, tag: str) -> None:
        """Cancel the consumer ``tag``; return once the broker confirmed it."""
        raise NotImplementedError

    async def _qos(self, prefetch: int) -> None:
        raise NotImplementedError

    async def _consume(self) -> str:
        """Subscribe to the queue; its consumer tag."""
        raise NotImplementedError

    async def _subscribe(self) -> None:
        """The first subscription of an opening."""
        self._subscribed = True
        self._tag = await self._consume()
        self._consuming = True

    @property
    def consuming(self) -> bool:
        return self._consuming

    def _is_ours(self, consumer_tag: object) -> bool:
        """Whether a cancel from the broker names the consumer this feed has now."""
        return self._tag is not None and consumer_tag == self._tag

    async def resubscribe(self, prefetch: int) -> None:
        """A consumer's prefetch cannot change once it consumes, and quorum queues
        refuse a channel-wide one: cancel, then consume again."""
        channel, old_tag = self._channel_now(), self._tag
        if channel is None or old_tag is None:
            return
        try:
            self._tag = None  # the cancel below is ours, not the broker's
            await self._cancel(old_tag)
            await self._qos(prefetch)
            if not self._subscribed or channel is not self._channel_now():
                return  # unsubscribed or reopened meanwhile
            self._tag = await self._consume()
        except self._lost_errors as exc:
            raise FeedLost(repr(exc)) from exc

    async def unsubscribe(self) -> None:
        self._subscribed = False
        tag, self._tag = self._tag, None
        if self._channel_now() is None or tag is None:
            self._consuming = False
            return
        try:  # returns once the broker confirmed it: nothing more is delivered
            await self._cancel(tag)
        except self._lost_errors as exc:
            log.debug("cancel failed: %r", exc)
        self._consuming = False

    def _forget(self) -> None:
        """The feed closes: no tag, nothing consuming."""
        self._tag = None
        self._consuming = False
