"""A consumer stopped while it reconnects, and a connection's close cut by a cancel.

The frame feed's test of connections closed under a consumer
(``tests/integration/test_frame_feed.py``) hung on RabbitMQ 4.3: ``stop()`` cancelled
the reconnect a broker-side close had started, without waiting for it, while it
opened the feed again; ``asyncio.run`` then cancelled it a second time, in the middle
of aio-pika's close of the feed's topology connection, which then waited for good
for a close callback that never came.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import uvloop

from delayq import Topology
from delayq.aio import AsyncConsumer
from delayq.aio._connection import close_shielded
from delayq.sync import apply_topology
from delayq.testing import MemoryBroker

LOOPS = pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
"""Each scenario on asyncio's loop and on uvloop (uvicorn's default)."""


def run_on(loop: str, coro: Any) -> None:
    factory = uvloop.new_event_loop if loop == "uvloop" else None
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(coro)


TOPOLOGY = Topology(
    namespace="stopping", ladder=["1s"], destinations=[{"queue": "work", "bindings": ["job.#"]}]
)


class _SlowClose:
    """An aio-pika connection whose close takes a few loop turns (a handshake)."""

    def __init__(self) -> None:
        self.is_closed = False
        self.steps = 0

    async def close(self) -> None:
        for _ in range(5):
            await asyncio.sleep(0)
            self.steps += 1
        self.is_closed = True


@LOOPS
def test_a_cancel_does_not_cut_a_shielded_close_it_waits_for_it_then_is_raised(loop: str) -> None:
    async def scenario() -> None:
        connection = _SlowClose()
        closing = asyncio.ensure_future(close_shielded(connection))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
        assert connection.is_closed and connection.steps == 5

    run_on(loop, scenario())


class _ReopenFeed:
    """A feed whose first opening works and whose second (the reconnect's) waits for the
    broker, closing what it opened once cancelled (a close of a few loop turns)."""

    inline = False
    clock_ms = None
    consuming = False

    def __init__(self) -> None:
        self.opened = 0
        self.on_lost: Callable[[BaseException], None] | None = None
        self.reopening = asyncio.Event()
        self.closed_what_it_opened = False

    async def open(self, topology: Any, queue: str, prefetch: int, on_delivery: Any,
                   on_lost: Callable[[BaseException], None]) -> None:  # fmt: skip
        self.opened += 1
        self.on_lost = on_lost
        if self.opened == 1:
            return
        connection = _SlowClose()
        try:
            self.reopening.set()
            await asyncio.Event().wait()  # the broker never answers
        finally:
            await close_shielded(connection)
            self.closed_what_it_opened = connection.is_closed

    async def resubscribe(self, prefetch: int) -> None:
        pass

    async def unsubscribe(self) -> None:
        pass

    async def ready(self) -> int:
        return 0

    async def close(self) -> None:
        pass


@LOOPS
def test_stop_waits_for_the_reconnect_it_cancels(memory_broker: MemoryBroker, loop: str) -> None:
    async def handler(body: Any) -> None:
        pass

    apply_topology(TOPOLOGY, memory_broker.url)

    async def scenario() -> None:
        feed = _ReopenFeed()
        consumer = AsyncConsumer(memory_broker.url, TOPOLOGY, "work", handler, feed=feed)
        await consumer.start()
        assert feed.on_lost is not None
        feed.on_lost(ConnectionError("closed by the broker"))  # a reconnect starts
        reconnecting = consumer._reconnecting
        assert reconnecting is not None
        await asyncio.wait_for(feed.reopening.wait(), 5)
        await consumer.stop()
        assert reconnecting.done() and feed.closed_what_it_opened

    run_on(loop, scenario())


class _LostAgainFeed(_ReopenFeed):
    """A feed whose reconnect opens it, but loses it again before the reconnect is over
    (the broker closes the new connection while the consumer connects its publisher)."""

    async def open(self, topology: Any, queue: str, prefetch: int, on_delivery: Any,
                   on_lost: Callable[[BaseException], None]) -> None:  # fmt: skip
        self.opened += 1
        self.on_lost = on_lost
        if self.opened == 2:
            on_lost(ConnectionError("closed again by the broker"))  # mid-reconnect


@LOOPS
def test_a_feed_lost_again_while_reconnecting_is_opened_once_more(
    memory_broker: MemoryBroker, loop: str
) -> None:
    """Not a consumer left on a dead feed: the second loss makes the reconnect go round
    once more (it was ignored, a reconnect being under way, and the reconnect then counted
    the dead feed as reconnected)."""

    async def handler(body: Any) -> None:
        pass

    apply_topology(TOPOLOGY, memory_broker.url)

    async def scenario() -> None:
        feed = _LostAgainFeed()
        consumer = AsyncConsumer(memory_broker.url, TOPOLOGY, "work", handler, feed=feed)
        await consumer.start()
        try:
            assert feed.on_lost is not None
            feed.on_lost(ConnectionError("closed by the broker"))
            for _ in range(200):
                if feed.opened >= 3 and consumer._reconnecting and consumer._reconnecting.done():
                    break
                await asyncio.sleep(0.01)
            assert feed.opened == 3, feed.opened
        finally:
            await consumer.stop()

    run_on(loop, scenario())


@LOOPS
def test_a_stall_check_that_finds_the_feed_gone_reports_it(
    monkeypatch: pytest.MonkeyPatch, loop: str
) -> None:
    """The stall guard's backstop: a feed lost with no reconnect under way (nothing
    heard its loss) is reported lost, where the guard used to look again for good."""
    from delayq.aio import _stalls
    from delayq.links import FeedLost

    monkeypatch.setattr(_stalls, "STALL_CHECK_S", 0.01)
    reported: list[BaseException] = []

    async def gone() -> int:
        raise FeedLost("the channel is closed")

    async def scenario() -> None:
        guard = asyncio.ensure_future(
            _stalls.watch_stalls("work", lambda: 0, lambda: False, gone, reported.append)
        )
        for _ in range(100):
            if reported:
                break
            await asyncio.sleep(0.01)
        guard.cancel()

    run_on(loop, scenario())
    assert reported and isinstance(reported[0], FeedLost)


@LOOPS
def test_a_wire_closed_while_its_close_is_cancelled_is_dropped_and_the_cancel_goes_on(
    loop: str,
) -> None:
    """A cancel of a task closing a frame connection (the broker never answers its
    Connection.Close) is not swallowed: the connection is dropped, the cancel raised."""
    from delayq.aio._wire import Wire
    from tests.unit.wire_fakes import Transport

    async def scenario() -> None:
        wire, transport = Wire(), Transport()
        wire.transport = transport  # type: ignore[assignment]
        closing = asyncio.ensure_future(wire.close(timeout_s=30))
        for _ in range(3):
            await asyncio.sleep(0)
        assert b"bye" in transport.written  # Connection.Close sent, no answer
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
        assert transport.closed

    run_on(loop, scenario())
