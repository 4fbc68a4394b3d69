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
import threading
import time
from collections.abc import Awaitable, Callable
from typing import IO, Any


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


class Lines:
    """A child process's text pipe read in a thread, so that a test waits for a line with a
    bound: a child that never says it (hung) fails the test with what it did say, instead
    of blocking the test until pytest's timeout ends the whole worker."""

    def __init__(self, pipe: IO[str]) -> None:
        self._lines: list[str] = []
        self._seen = 0
        self._changed = threading.Condition()
        self._ended = False
        threading.Thread(target=self._read, args=(pipe,), daemon=True).start()

    def _read(self, pipe: IO[str]) -> None:
        for line in pipe:
            with self._changed:
                self._lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def until(self, *parts: str, timeout_s: float) -> str:
        """Wait for lines (after those an earlier call matched) holding each of ``parts``;
        the last one read. Fails saying what was read when the pipe ends or the time
        passes first."""
        deadline = time.monotonic() + timeout_s
        awaited = set(parts)
        with self._changed:
            while True:
                while self._seen < len(self._lines):
                    line = self._lines[self._seen]
                    self._seen += 1
                    awaited = {part for part in awaited if part not in line}
                    if not awaited:
                        return line
                left = deadline - time.monotonic()
                if self._ended or left <= 0:
                    why = "the pipe ended" if self._ended else f"{timeout_s:g} s passed"
                    raise AssertionError(
                        f"{why} before a line said {sorted(awaited)}; it said:\n{self.text()}"
                    )
                self._changed.wait(left)

    def ended(self, timeout_s: float) -> str:
        """Everything read, once the pipe ended (its process exited) within ``timeout_s``."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._ended, timeout_s):
                raise AssertionError(f"the pipe stayed open {timeout_s:g} s:\n{self.text()}")
            return self.text()

    def text(self) -> str:
        return "".join(self._lines)
