"""The asyncio link's batch senders: how a batch ends, without a broker."""

from __future__ import annotations

import asyncio

import pytest

from delayq.aio._link import AioPikaLink
from delayq.errors import AccessRefused, PublishRejected

run_senders = AioPikaLink._run_senders


async def idle_watchdog() -> None:
    await asyncio.sleep(3600)


def test_every_sender_runs_to_the_end() -> None:
    work = iter(range(5_000))
    done: list[int] = []

    async def sender() -> None:
        for item in work:
            await asyncio.sleep(0)
            done.append(item)

    asyncio.run(run_senders(sender, idle_watchdog, 1_000))
    assert sorted(done) == list(range(5_000))


def test_the_first_failing_sender_stops_the_others_and_its_error_is_raised() -> None:
    started: list[int] = []
    cancelled: list[int] = []

    async def sender() -> None:
        me = len(started)
        started.append(me)
        try:
            if me == 3:
                await asyncio.sleep(0.01)
                raise PublishRejected("nacked", "m-3")
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(me)
            raise

    with pytest.raises(PublishRejected, match="nacked"):
        asyncio.run(asyncio.wait_for(run_senders(sender, idle_watchdog, 10), 10))
    assert sorted(cancelled) == [n for n in range(10) if n != 3]


def test_access_refused_wins_over_other_errors() -> None:
    count = 0

    async def sender() -> None:
        nonlocal count
        count += 1
        me = count
        await asyncio.sleep(0)
        if me == 1:
            raise PublishRejected("nacked", "m-1")
        raise AccessRefused("no write permission")

    with pytest.raises(AccessRefused):
        asyncio.run(asyncio.wait_for(run_senders(sender, idle_watchdog, 2), 10))


def test_a_watchdog_that_gives_up_ends_the_batch_with_its_error() -> None:
    async def sender() -> None:
        await asyncio.sleep(3600)  # a confirm that never comes

    async def watchdog() -> None:
        await asyncio.sleep(0.01)
        raise TimeoutError("no confirm for 60 s")

    with pytest.raises(TimeoutError, match="no confirm"):
        asyncio.run(asyncio.wait_for(run_senders(sender, watchdog, 50), 10))
