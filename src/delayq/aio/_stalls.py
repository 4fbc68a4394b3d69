"""The asyncio consumer's stall guard: a consumer the broker forgot without telling.

Seen with quorum queues after many connection losses in a row: the channel stays
open, the queue holds ready messages, and nothing arrives any more. The guard
re-subscribes (through ``lost``) when messages are ready but none has arrived for
a while and nothing is in flight. Arrivals are counted, not timed (timing would
cost every delivery): idle means since the check that last saw the count move.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from delayq.consume.settings import STALL_CHECK_S
from delayq.links import FeedLost

__all__ = ["watch_stalls"]

log = logging.getLogger("delayq.consumer")


async def watch_stalls(
    queue: str,
    arrivals: Callable[[], int],
    busy: Callable[[], bool],
    ready: Callable[[], Awaitable[int]],
    lost: Callable[[BaseException], None],
) -> None:
    """Every ``STALL_CHECK_S``: unless ``busy()`` (deliveries in flight, reconnecting),
    ask ``ready()`` when ``arrivals()`` has not moved, and report a stall to ``lost``."""
    loop = asyncio.get_running_loop()
    seen, moved_at = arrivals(), loop.time()
    while True:
        await asyncio.sleep(STALL_CHECK_S)
        if arrivals() != seen:
            seen, moved_at = arrivals(), loop.time()
            continue
        if busy() or loop.time() - moved_at < STALL_CHECK_S:
            continue
        try:
            waiting = await ready()
        except FeedLost as exc:
            log.debug("stall check on %s failed: %s", queue, exc)
            if not busy():  # its feed is gone and nothing is reconnecting it
                lost(exc)
            continue
        if waiting and not busy() and arrivals() == seen:
            idle_s = loop.time() - moved_at
            lost(RuntimeError(f"{waiting} messages ready but none delivered for {idle_s:.0f} s"))
