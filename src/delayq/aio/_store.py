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
import concurrent.futures
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


class StoreBatcher:
    """Awaitable claim / complete / release / prune on one store, batched."""

    def __init__(self, store: IdempotencyStore) -> None:
        self.store = store
        self._blocking = bool(store.blocking)
        self._executor_: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: list[tuple[StoreOp, asyncio.Future[ClaimStatus | None]]] = []
        self._scheduled = False
        self._running = False
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
        says.
        """
        if not self._blocking:
            return self.answer_now(op)
        try:
            if type(op) is Claim:
                return await self._claimed(op)
            return await self._enqueue(op)
        except StoreError as exc:
            return exc

    async def complete(self, key: str, *, now_ms: int) -> None:
        await self._submit(Complete(key, now_ms))

    async def release(self, key: str) -> None:
        await self._submit(Release(key))

    @property
    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        """The one thread all I/O goes through (made again after :meth:`close`)."""
        if self._executor_ is None:
            self._executor_ = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="delayq-store"
            )
        return self._executor_

    async def prune(self, *, older_than_ms: int) -> int:
        """Run in the store's thread, between batches."""
        try:
            if not self._blocking:
                return self.store.prune(older_than_ms=older_than_ms)
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(
                self._executor, lambda: self.store.prune(older_than_ms=older_than_ms)
            )
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
            loop.call_soon(self._flush)
        return future

    def _give_back(self, key: str, claimed: asyncio.Future[ClaimStatus | None]) -> None:
        if claimed.exception() is not None:
            return  # the store failed: the claim did not land (or its lease ends by itself)
        if claimed.result() is ClaimStatus.CLAIMED:
            self._enqueue(Release(key))

    def _flush(self) -> None:
        self._scheduled = False
        if self._running or not self._pending:
            return
        batch = self._pending[:MAX_BATCH]
        del self._pending[:MAX_BATCH]
        self._running = True
        loop = asyncio.get_running_loop()
        ops = [op for op, _ in batch]
        self.batches += 1
        self.ops += len(ops)
        done = loop.run_in_executor(self._executor, run_ops, self.store, ops)
        done.add_done_callback(lambda f: self._settle(batch, f))

    def _settle(
        self,
        batch: list[tuple[StoreOp, asyncio.Future[ClaimStatus | None]]],
        done: asyncio.Future[list[ClaimStatus | None]],
    ) -> None:
        self._running = False
        loop = asyncio.get_running_loop()
        error: BaseException | None = None
        results: list[Any] = []
        if done.cancelled():
            error = StoreError(f"idempotency store {self.store!r}: the batch was cancelled")
        elif done.exception() is not None:
            error = done.exception()
        else:
            results = done.result()
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
            self._flush()

    def close(self) -> None:
        if self._executor_ is not None:
            self._executor_.shutdown(wait=True)
            self._executor_ = None
