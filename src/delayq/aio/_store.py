"""Idempotency-store calls for the asyncio consumer, batched per event-loop turn.

Every delivery claims its key before the handler and completes it after. With a
store that does I/O, one thread hop and one round trip (or one SQLite commit)
per call would cost more than the rest of the consumer together; so the
operations requested during one turn of the event loop are sent together, from
one dedicated thread, in one :meth:`~delayq.stores.base.BatchingStore.run_batch`
(one transaction, one pipeline). While a batch runs, the next one gathers: a
group commit. Each caller still awaits its own result, so nothing is acked
before its key is recorded.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any

from delayq.errors import StoreError
from delayq.stores.base import (
    Claim,
    ClaimStatus,
    Complete,
    IdempotencyStore,
    Release,
    StoreOp,
    apply_op,
    run_ops,
    store_error,
)

__all__ = ["StoreBatcher"]

MAX_BATCH = 500
GATHER_OPS = 64
"""A batch smaller than this waits for the next loop turn while turns keep adding to it."""
GATHER_TURNS = 4
"""At most this many loop turns of waiting (a turn of an idle loop costs microseconds)."""


class StoreBatcher:
    """Awaitable claim / complete / release / prune on one store, batched."""

    def __init__(self, store: IdempotencyStore) -> None:
        self.store = store
        self._blocking = bool(store.blocking)
        self._thread: _StoreThread | None = None
        self._pending: list[tuple[StoreOp, asyncio.Future[ClaimStatus | None]]] = []
        self._scheduled = False
        self._running = False
        self._seen = 0  # ops pending when the batch was last looked at
        self._waited = 0  # loop turns the next batch waited so far
        self.batches = 0
        """Batches sent to the store: with :attr:`ops`, how well its calls batch."""
        self.ops = 0

    async def claim(self, key: str, *, lease_ms: int, now_ms: int) -> ClaimStatus:
        op = Claim(key, lease_ms, now_ms)
        if not self._blocking:
            status = self._apply(op)
        else:
            status = await self._claimed(op)
        assert status is not None
        return status

    async def _claimed(self, op: Claim) -> ClaimStatus | None:
        """A claim's result; a claim won for a caller cancelled meanwhile is given back.

        aiormq cancels deliveries in flight when the connection is lost. The claim goes
        on in the store's thread (the cancelled future stays in its batch: see
        :meth:`_settle`), or has even landed with its result set before this task could
        resume (here): a claim won for nobody is given back, or every redelivery of the
        key is deferred until the lease runs out. No ``asyncio.shield``: that is two
        more futures per delivery.
        """
        claimed = self._enqueue(op)
        try:
            return await claimed
        except asyncio.CancelledError:
            if claimed.done() and not claimed.cancelled():
                self._give_back(op.key, claimed)
            raise

    @property
    def inline(self) -> bool:
        """Whether the store does no I/O: its steps are answered at once (:meth:`answer_now`)."""
        return not self._blocking

    def answer_now(self, op: StoreOp) -> ClaimStatus | StoreError | None:
        """:meth:`answer` for a store that does no I/O, without a coroutine."""
        try:
            return self._apply(op)
        except StoreError as exc:
            return exc

    async def answer(self, op: StoreOp) -> ClaimStatus | StoreError | None:
        """``op``'s result or its :class:`StoreError`: the answer to a delivery flow's
        store step (see :mod:`delayq.consume.flow`).

        One coroutine per step, awaiting the batch's future itself (this runs twice per
        delivery with a store that does I/O); a claim is given back as :meth:`_claimed`
        says (its code is repeated here: a coroutine less per delivery).
        """
        if not self._blocking:
            return self.answer_now(op)
        answered = self._enqueue(op)
        try:
            return await answered
        except StoreError as exc:
            return exc
        except asyncio.CancelledError:
            if type(op) is Claim and answered.done() and not answered.cancelled():
                self._give_back(op.key, answered)
            raise

    async def complete(self, key: str, *, now_ms: int) -> None:
        await self._submit(Complete(key, now_ms))

    async def release(self, key: str) -> None:
        await self._submit(Release(key))

    def _in_thread(
        self, call: Callable[[], Any], done: Callable[[Any, BaseException | None], None]
    ) -> None:
        """``call()`` in the store's one thread (made again after :meth:`close`), then
        ``done(result, error)`` in the running loop."""
        if self._thread is None:
            self._thread = _StoreThread()
        self._thread.put(call, asyncio.get_running_loop(), done)

    async def prune(self, *, older_than_ms: int) -> int:
        """Run in the store's thread, between batches."""
        try:
            if not self._blocking:
                return self.store.prune(older_than_ms=older_than_ms)
            pruned: asyncio.Future[int] = asyncio.get_running_loop().create_future()

            def done(result: Any, error: BaseException | None) -> None:
                if pruned.done():
                    return
                if error is not None:
                    pruned.set_exception(error)
                else:
                    pruned.set_result(result)

            self._in_thread(lambda: self.store.prune(older_than_ms=older_than_ms), done)
            return await pruned
        except Exception as exc:
            raise store_error(self.store, exc) from exc

    async def _submit(self, op: StoreOp) -> ClaimStatus | None:
        if not self._blocking:  # an in-memory store: no I/O, no batching
            return self._apply(op)
        return await self._enqueue(op)

    def _apply(self, op: StoreOp) -> ClaimStatus | None:
        try:
            return apply_op(self.store, op)
        except Exception as exc:
            raise store_error(self.store, exc) from exc

    def _enqueue(self, op: StoreOp) -> asyncio.Future[ClaimStatus | None]:
        """Queue ``op`` for the next batch; it runs even if its caller stops waiting."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[ClaimStatus | None] = loop.create_future()
        self._pending.append((op, future))
        if not self._scheduled and not self._running:
            self._scheduled = True
            self._seen, self._waited = len(self._pending), 0
            loop.call_soon(self._flush)
        return future

    def _give_back(self, key: str, claimed: asyncio.Future[ClaimStatus | None]) -> None:
        if claimed.exception() is not None:
            return  # the store failed: the claim did not land (or its lease ends by itself)
        if claimed.result() is ClaimStatus.CLAIMED:
            self._enqueue(Release(key))

    def _flush(self) -> None:
        """Send the pending operations, unless the last loop turn added to them: a busy
        loop (deliveries arriving each turn) then gathers a few turns' worth first, up
        to :data:`GATHER_OPS` or :data:`GATHER_TURNS`. A commit and a thread hop per
        batch cost more than its rows; a loop with nothing else to do sends at once."""
        self._scheduled = False
        if self._running or not self._pending:
            return
        pending = len(self._pending)
        if self._seen < pending < GATHER_OPS and self._waited < GATHER_TURNS:
            self._seen = pending
            self._waited += 1
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
            return
        batch = self._pending[:MAX_BATCH]
        del self._pending[:MAX_BATCH]
        self._running = True
        ops = [op for op, _ in batch]
        self.batches += 1
        self.ops += len(ops)
        store = self.store
        self._in_thread(
            lambda: run_ops(store, ops),
            lambda results, error: self._settle(batch, results, error),
        )

    def _settle(
        self,
        batch: list[tuple[StoreOp, asyncio.Future[ClaimStatus | None]]],
        results: list[ClaimStatus | None],
        error: BaseException | None,
    ) -> None:
        self._running = False
        loop = asyncio.get_running_loop()
        for index, (op, future) in enumerate(batch):
            if future.done():  # cancelled: nobody waits for it
                if error is None and type(op) is Claim and results[index] is ClaimStatus.CLAIMED:
                    self._pending.append((Release(op.key), loop.create_future()))
                continue
            if error is not None:
                failure = StoreError(str(error))
                failure.__cause__ = error.__cause__ or error
                future.set_exception(failure)
            else:
                future.set_result(results[index])
        if self._pending:
            self._seen, self._waited = 0, 0
            self._flush()

    def close(self) -> None:
        """Let the store's thread finish what it was given, then end it."""
        if self._thread is not None:
            self._thread.stop()
            self._thread = None


class _StoreThread:
    """One thread that runs calls in order and hands each result to its loop.

    Lighter than an executor's: no ``concurrent.futures.Future`` and no chained asyncio
    future per call, one ``call_soon_threadsafe`` back (the hop is paid per batch, and
    the Python it runs holds the GIL the loop needs).
    """

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="delayq-store", daemon=True)
        self._thread.start()

    def put(
        self,
        call: Callable[[], Any],
        loop: asyncio.AbstractEventLoop,
        done: Callable[[Any, BaseException | None], None],
    ) -> None:
        self._calls.put((call, loop, done))

    def stop(self) -> None:
        self._calls.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        while (item := self._calls.get()) is not None:
            call, loop, done = item
            result: Any = None
            error: BaseException | None = None
            try:
                result = call()
            except BaseException as exc:  # handed to the loop, like an executor's
                error = exc
            try:
                loop.call_soon_threadsafe(done, result, error)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass
            del call, done, item, result, error


_Call = tuple[
    Callable[[], Any], asyncio.AbstractEventLoop, Callable[[Any, BaseException | None], None]
]
