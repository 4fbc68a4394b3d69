"""Running an async consumer's handler: a coroutine on the loop, a plain or transactional
one in a thread pool of the consumer's own, all under one watchdog for their deadlines.

A delivery cancelled while its handler runs in a thread (a lost connection, a stop) is
*cut*: the thread goes on, and when it ends its key is recorded (or its claim given
back), so the redelivery is a skipped duplicate rather than a second effect.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, cast

from delayq.aio._store import StoreBatcher
from delayq.errors import HandlerTimeout, StoreError
from delayq.stores.base import Claim, TransactionalStore, call_in_transaction

__all__ = ["HandlerCut", "HandlerRunner"]

log = logging.getLogger("delayq.consumer")

TransactionalHandler = Callable[[Any, Any], object]
AsyncHandler = Callable[..., Awaitable[Any]]


class HandlerCut(Exception):
    """The delivery was cancelled (connection lost, stop) while its handler ran in a
    thread, which goes on: ``running`` ends when the thread does."""

    def __init__(self, running: asyncio.Future[Any]) -> None:
        super().__init__("handler thread cut from its delivery")
        self.running = running


class HandlerRunner:
    """One consumer's handler calls, their threads, deadlines and cut ends."""

    def __init__(
        self,
        handler: Callable[..., Any],
        *,
        is_async: bool,
        transactional: bool,
        store: StoreBatcher | None,
        timeout_ms: int,
        threads: int,
        clock_ms: Callable[[], int],
        queue: str,
    ) -> None:
        self._handler = handler
        self._is_async = is_async
        self._transactional = transactional
        self._store = store
        self._timeout_ms = timeout_ms
        self._size = threads
        """Twice the handlers that may run: a handler past its timeout keeps its thread."""
        self._clock_ms = clock_ms
        self._queue = queue
        self._threads: concurrent.futures.ThreadPoolExecutor | None = None
        self._deadlines: dict[asyncio.Task[Any], float] = {}
        self._timed_out: set[asyncio.Task[Any]] = set()
        self.finishing: set[asyncio.Task[None]] = set()
        """Tasks recording the keys of cut handlers once their threads end."""

    def shutdown(self) -> None:
        """Let the threads go (a stuck handler holds up no one)."""
        if self._threads is not None:
            self._threads.shutdown(wait=False)
            self._threads = None

    async def release(self, store: StoreBatcher, key: str) -> None:
        try:
            await store.release(key)
        except StoreError as exc:  # the claim's lease ends by itself
            log.warning("releasing key %r failed: %s", key, exc)

    def finish_cut(self, running: asyncio.Future[Any], key: str) -> None:
        """When a cut handler thread ends, record its key (or give the claim back if it
        failed), so the redelivery is a skipped duplicate rather than a second effect."""
        store = self._store
        assert store is not None

        async def finish() -> None:
            try:
                await running
            except BaseException:
                await self.release(store, key)
                return
            if self._transactional:
                return  # the handler's commit recorded the key
            try:
                await store.complete(key, now_ms=self._clock_ms())
            except StoreError as exc:  # the lease ends by itself; a redelivery may rerun
                log.warning("recording key %r of a cut handler failed: %s", key, exc)

        finishing = asyncio.get_running_loop().create_task(finish())
        self.finishing.add(finishing)
        finishing.add_done_callback(self.finishing.discard)

    def _in_thread(
        self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> asyncio.Future[Any]:
        """Run a plain handler in a thread of this consumer's own, with this task's context.

        Not the loop's default executor: that one has ``cpu_count + 4`` threads, shared
        with everything else, which silently capped plain handlers below
        ``concurrency``. Twice the slots: a handler past its timeout keeps its thread
        (it cannot be killed) while its slot takes the next delivery.
        """
        if self._threads is None:
            self._threads = concurrent.futures.ThreadPoolExecutor(
                self._size, thread_name_prefix="delayq-handler"
            )
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        return asyncio.get_running_loop().run_in_executor(self._threads, call)

    async def call(self, value: Any, claim: Claim | None, task: asyncio.Task[Any]) -> None:
        """Run the handler in ``task`` (the running one); the watchdog cancels it past
        ``handler_timeout``."""
        self._deadlines[task] = task.get_loop().time() + self._timeout_ms / 1000
        running: asyncio.Future[Any] | None = None
        try:
            if self._transactional:
                assert self._store is not None and claim is not None
                running = self._in_thread(
                    call_in_transaction,
                    cast(TransactionalStore, self._store.store),
                    cast(TransactionalHandler, self._handler),
                    value,
                    key=claim.key,
                    lease_until_ms=claim.lease_until_ms,
                    now_ms=self._clock_ms(),
                )
                await asyncio.shield(running)
            elif self._is_async:
                await cast(AsyncHandler, self._handler)(value)
            else:
                running = self._in_thread(self._handler, value)
                await asyncio.shield(running)
        except asyncio.CancelledError:
            if task not in self._timed_out:
                if running is not None:
                    raise HandlerCut(running) from None
                raise
            uncancel = getattr(task, "uncancel", None)  # Python 3.11+
            if uncancel is not None:
                uncancel()
            if running is not None:  # its thread goes on: what it ends with is logged
                running.add_done_callback(_ended_after_timeout)
            raise HandlerTimeout(
                f"handler for {self._queue!r} ran longer than {self._timeout_ms / 1000:g} s"
            ) from None
        finally:
            self._deadlines.pop(task, None)
            self._timed_out.discard(task)

    async def watch_timeouts(self) -> None:
        """One timer for all handlers: cancel those past their deadline."""
        loop = asyncio.get_running_loop()
        period = min(1.0, max(0.01, self._timeout_ms / 10_000))
        while True:
            await asyncio.sleep(period)
            now = loop.time()
            late = [task for task, deadline in self._deadlines.items() if deadline <= now]
            for task in late:
                del self._deadlines[task]
                self._timed_out.add(task)
                task.cancel()


def _ended_after_timeout(running: asyncio.Future[Any]) -> None:
    """A handler thread abandoned past its timeout ended: say how (a transactional one's
    ``ClaimLost``: its writes were rolled back), never "exception was never retrieved"."""
    if running.cancelled():
        return
    error = running.exception()
    if error is not None:
        log.warning("a handler abandoned past its timeout ended with %r", error)
