"""A batch on the frame link: up to ``window`` unconfirmed, re-sent on a fresh connection.

A batch runs in *rounds*, one per connection (as the sync pipeline,
:mod:`delayq.sync._pipeline`): each confirm frees a place in the window, which the
next message takes at once (its frames join the loop turn's one write). When the
connection or the publish channel is lost, what was in flight goes back to the
front and the next round sends it again (same message ids: idempotent consumers
skip duplicates). A round that confirmed nothing costs one of ``publish_attempts``
until the link has been up, and counts against ``reconnect_within`` after
(:class:`delayq.retrying.Reconnecting`); when they are spent, or no connection can
be opened, what is left is reported: :class:`~delayq.errors.PublishUnconfirmed` for
what was written to a lost connection, :class:`~delayq.errors.PublishNotSent` for
what never was.

The confirm watchdog: with messages in flight and no confirm for the link's
confirm timeout, a blocked broker (``connection.blocked``: a resource alarm) fails
what is left with :class:`~delayq.errors.PublishBlocked`; otherwise the connection
is dropped and its unconfirmed messages re-sent.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import TYPE_CHECKING

from delayq.aio._wire import PUBLISH_CHANNEL, ChannelClosed, Wire, WireClosed
from delayq.errors import (
    AccessRefused,
    BrokerError,
    ConnectionFailed,
    DelayqError,
    HeaderFrameTooLarge,
    PublishBatchError,
    PublishError,
    PublishUnconfirmed,
    TopologyMissing,
)
from delayq.message import outcomes
from delayq.message.envelope import OutgoingMessage
from delayq.message.frames import publish_frames
from delayq.retrying import pause_s
from delayq.topology.conflicts import conflict_from_reply, missing_from_reply, refused_from_reply

if TYPE_CHECKING:
    from delayq.aio._framelink import FrameLink

__all__ = ["channel_error", "send_batch"]


def channel_error(exc: ChannelClosed) -> DelayqError:
    """A delayq error for a channel the broker closed (404 missing, 406 conflict, 403 refused)."""
    text = exc.reply_text
    found: DelayqError | None = (
        missing_from_reply(text) or conflict_from_reply(text) or refused_from_reply(text)
    )
    return found if found is not None else BrokerError(f"the broker closed the channel: {text}")


class _Round:
    """One connection's share of a batch; the wire's sink for its messages."""

    def __init__(self, batch: _Batch, wire: Wire) -> None:
        self.batch = batch
        self.wire = wire
        self.in_flight: set[int] = set()
        self.confirmed = 0
        self.lost: Exception | None = None
        self.over = wire.loop.create_future()
        self.stopped = False
        self.paused = False
        """Waiting for the socket to take what was written (the transport's flow control)."""

    def fill(self) -> None:
        batch, wire, in_flight = self.batch, self.wire, self.in_flight
        built, window, frame_max = batch.built, batch.window, wire.frame_max
        while len(in_flight) < window and not self.stopped:
            if not wire.writable:  # the socket is behind: hold the rest until it drains
                if not self.paused:
                    self.paused = True
                    wire.when_writable(self._resume)
                return
            index = batch.take()
            if index is None:
                break
            msg = built[index]
            try:
                frames = publish_frames(msg, PUBLISH_CHANNEL, frame_max)
            except HeaderFrameTooLarge as exc:  # not sent; the rest of the batch goes on
                batch.failures[index] = exc
                continue
            in_flight.add(index)
            try:
                wire.publish(frames, self, index, (msg.exchange, msg.routing_key, msg.message_id))
            except (WireClosed, ChannelClosed) as exc:
                self.failed(index, exc)
                return
        if not in_flight:
            self._end()

    def _resume(self) -> None:
        self.paused = False
        if not self.stopped:
            self.fill()
        elif not self.in_flight:
            self._end()

    def settled(self, token: int, acked: bool, returned: bool) -> None:
        if token not in self.in_flight:  # given up on already (a blocked broker)
            return
        self.in_flight.remove(token)
        self.confirmed += 1
        batch = self.batch
        batch.progress_at = time.monotonic()
        if returned:
            batch.failures[token] = outcomes.unroutable(batch.built[token])
        elif not acked:
            batch.failures[token] = outcomes.rejected(batch.built[token])
        self.fill()

    def failed(self, token: int, exc: Exception) -> None:
        if token not in self.in_flight:
            return
        self.in_flight.remove(token)
        if self.lost is None:
            self.lost = exc
        batch = self.batch
        if isinstance(exc, ChannelClosed):
            # The channel closed with this message on it (an exchange deleted since it was
            # checked, a refusal): re-sending would only close the next channel too.
            batch.channel_failure(token, exc)
        else:
            batch.again.append(token)
        self.stopped = True
        if not self.in_flight:
            self._end()

    def _end(self) -> None:
        if not self.over.done():
            self.over.set_result(None)


class _Batch:
    def __init__(self, link: FrameLink, built: list[OutgoingMessage], window: int) -> None:
        self.link = link
        self.built = built
        self.window = max(1, window)
        self.failures: dict[int, PublishError] = {}
        self.again: deque[int] = deque()
        self.next = 0
        self.progress_at = time.monotonic()
        self.refused: AccessRefused | None = None

    def take(self) -> int | None:
        if self.again:
            return self.again.popleft()
        if self.next < len(self.built):
            self.next += 1
            return self.next - 1
        return None

    def left(self) -> list[int]:
        """What is neither settled nor in flight (taken out)."""
        written, never = self.left_apart()
        return [*written, *never]

    def left_apart(self) -> tuple[list[int], list[int]]:
        """What is neither settled nor in flight (taken out): what a lost connection had
        in flight (its fate unknown), and what was never written."""
        written, never = list(self.again), list(range(self.next, len(self.built)))
        self.again.clear()
        self.next = len(self.built)
        return written, never

    def channel_failure(self, index: int, exc: ChannelClosed) -> None:
        msg = self.built[index]
        error = channel_error(exc)
        if isinstance(error, AccessRefused):
            self.refused = error
        if isinstance(error, TopologyMissing):
            self.failures[index] = PublishUnconfirmed(str(error), msg.message_id)
        else:
            self.failures[index] = outcomes.rejected(msg, str(error))

    def fail_left(self, cause: BaseException | None, spent: str) -> None:
        """Settle what is left once the connection cannot be had again: what was written
        ``PublishUnconfirmed`` (its fate unknown), the rest ``PublishNotSent``."""
        url = self.link.shown_url
        written, never = self.left_apart()
        for index in written:
            self.failures[index] = outcomes.unconfirmed(self.built[index], spent, url, cause)
        for index in never:
            self.failures[index] = outcomes.not_sent(self.built[index], spent, url, cause)

    def fail_missing(self, cause: TopologyMissing) -> None:
        for index in self.left():
            msg = self.built[index]
            self.failures[index] = PublishUnconfirmed(str(cause), msg.message_id)

    async def run(self) -> None:
        """Rounds until everything is settled. A lost connection is opened again
        (:meth:`FrameLink.wire`: for ``reconnect_within`` once the link has been up); a
        round that confirmed nothing counts against the same budget
        (:meth:`delayq.retrying.Reconnecting.gives_up`)."""
        link = self.link
        reconnecting = link.reconnecting
        barren = 0
        quiet_since = time.monotonic()
        handed_over = False
        last: BaseException | None = None
        while self.again or self.next < len(self.built):
            if barren:
                await asyncio.sleep(pause_s(barren, link.backoff_s))
            try:
                wire = await link.wire()
                await link.check_exchanges(wire, {m.exchange for m in self.built})
            except ConnectionFailed as exc:
                if not handed_over:
                    raise  # nothing of the batch was sent: say so plainly
                self.fail_left(exc, reconnecting.spent(barren + 1))
                return
            except DelayqError as exc:
                if not handed_over:
                    raise
                if isinstance(exc, TopologyMissing):  # deleted during the batch
                    self.fail_missing(exc)
                    return
                raise
            except WireClosed as exc:
                last = exc
                barren += 1
                if reconnecting.gives_up(barren, link.publish_attempts, quiet_since):
                    break
                continue
            rnd = _Round(self, wire)
            handed_over = True
            self.progress_at = time.monotonic()
            try:
                rnd.fill()
                if await self._watch(rnd):
                    return  # blocked: what is left failed with PublishBlocked
            finally:
                rnd.stopped = True
            if self.refused is not None:
                raise self.refused
            if rnd.lost is not None:
                last = rnd.lost
                link.warn_lost(wire, rnd.lost, "re-sending the batch's unconfirmed messages")
                if isinstance(rnd.lost, WireClosed):
                    link.drop(wire)
            if rnd.confirmed:
                barren, quiet_since = 0, time.monotonic()
            else:
                barren += 1
            if reconnecting.gives_up(barren, link.publish_attempts, quiet_since):
                break
        if self.again or self.next < len(self.built):
            self.fail_left(last, reconnecting.spent(barren))

    async def _watch(self, rnd: _Round) -> bool:
        """Wait for the round to end; returns whether the broker blocked it for good."""
        link = self.link
        while True:
            wait_s = self.progress_at + link.confirm_timeout_s - time.monotonic()
            since = rnd.wire.blocked_at
            if since is not None:  # blocked: the bound on that is its own
                wait_s = min(wait_s, since + link.blocked_timeout_s - time.monotonic())
            if wait_s > 0:  # a look a second at most: a block may begin meanwhile
                await asyncio.wait([rnd.over], timeout=min(wait_s, 1.0))
                if rnd.over.done():
                    return False
                continue
            if rnd.wire.blocked:
                # Re-sending cannot help while the broker blocks publishers (a fresh
                # connection is blocked at its first publish too).
                stuck = [*rnd.in_flight, *self.left()]
                rnd.in_flight.clear()
                for index in stuck:
                    self.failures[index] = outcomes.blocked(
                        self.built[index], link.blocked_s(rnd.wire), link.shown_url
                    )
                link.drop(rnd.wire)
                return True
            link.warn_lost(
                rnd.wire,
                TimeoutError(f"no confirm for {link.confirm_timeout_s:g} s"),
                "reconnecting to re-send the batch's unconfirmed messages",
            )
            self.progress_at = time.monotonic()
            link.drop(rnd.wire)  # fails what is in flight back to this round: re-sent


async def send_batch(link: FrameLink, built: list[OutgoingMessage], window: int) -> None:
    """Send ``built`` with up to ``window`` unconfirmed; raise
    :class:`~delayq.errors.PublishBatchError` naming each message not confirmed."""
    batch = _Batch(link, built, window)
    await batch.run()
    if batch.failures:
        failures = batch.failures
        receipts = [None if i in failures else m.receipt for i, m in enumerate(built)]
        raise PublishBatchError(receipts, failures)
