"""Wait for a state instead of sleeping and hoping it is there.

A test that sees an effect through one channel (a message in the DLQ, a raw
collector's arrival, a handler's side effect) and then reads state another path
updates (a consumer's stats, observers, records, metrics, a queue's count) must
wait for that state: the other path may not have run yet, and on a loaded machine
it often has not.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any


def wait_for(
    predicate: Callable[[], object],
    timeout_s: float,
    what: str | Callable[[], str],
    *,
    interval_s: float = 0.02,
) -> None:
    """Return as soon as ``predicate()`` is true; fail after ``timeout_s`` seconds saying
    which state never came (``what``, or ``what()`` for a description of the last state)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            described = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {described}")
        time.sleep(interval_s)


async def wait_for_async(
    predicate: Callable[[], object | Awaitable[object]],
    timeout_s: float,
    what: str | Callable[[], str],
    *,
    interval_s: float = 0.02,
) -> None:
    """:func:`wait_for` inside an event loop, which keeps running meanwhile; ``predicate``
    may be a coroutine function."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            described = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {described}")
        await asyncio.sleep(interval_s)


def first_message(url: str, queue: str, timeout_s: float = 30) -> tuple[Any, Any, bytes]:
    """The first message ``queue`` holds, taken (``basic_get``) as soon as there is one:
    ``(method, properties, body)``, the method ``None`` if none came within ``timeout_s``."""
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        deadline = time.monotonic() + timeout_s
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        while method is None and time.monotonic() < deadline:
            connection.sleep(0.05)
            method, properties, body = channel.basic_get(queue, auto_ack=True)
        return method, properties, body
    finally:
        connection.close()
