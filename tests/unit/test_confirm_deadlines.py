"""The confirm deadlines of single asyncio sends: one timer per link, none per message."""

from __future__ import annotations

import asyncio

import pytest

from delayq.aio._framelink import _Deadlines


def test_a_send_past_its_deadline_times_out_and_the_confirmed_are_forgotten() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        deadlines = _Deadlines(0.05)
        confirmed = [loop.create_future() for _ in range(1000)]
        waiting = loop.create_future()
        for future in confirmed:
            deadlines.watch(loop, future)
            future.set_result((True, False))
        deadlines.watch(loop, waiting)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(waiting, 10)  # the outer bound only: it times out at 0.05
        assert not deadlines._queue  # nothing kept once settled or expired
        assert deadlines._timer is None

    asyncio.run(run())


def test_a_link_used_under_a_second_event_loop_still_times_out() -> None:
    deadlines = _Deadlines(0.05)

    async def one() -> None:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        deadlines.watch(loop, future)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(future, 10)

    async def abandoned() -> None:  # its loop ends with a send still watched
        loop = asyncio.get_running_loop()
        deadlines.watch(loop, loop.create_future())

    asyncio.run(abandoned())
    asyncio.run(one())
