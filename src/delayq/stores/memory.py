"""The in-memory idempotency store: for tests and single-process tools."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

from delayq.stores.base import (
    CANCELLED_GENERATION,
    Cancel,
    CancelStatus,
    ClaimStatus,
    check_cancel,
    closed_error,
)
from delayq.stores.uncancel import UncancelStatus, check_uncancel, uncancel_status

__all__ = ["InMemoryStore"]


class InMemoryStore:
    """A store in this process's memory: for tests and single-process tools."""

    blocking = False

    def __init__(self) -> None:
        self._done: dict[str, int] = {}
        self._leases: dict[str, int] = {}
        self._marks: dict[str, tuple[int, int]] = {}
        """Cancelled or rescheduled keys: (generation, marked at)."""
        self._lock = threading.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"InMemoryStore(keys={len(self._done)})"

    def _check_open(self) -> None:
        if self._closed:
            raise closed_error(self)

    def claim(self, key: str, *, lease_ms: int, now_ms: int, generation: int = 0) -> ClaimStatus:
        with self._lock:
            self._check_open()
            if self._marks:  # nothing to look up while nothing was ever cancelled
                mark = self._marks.get(key)
                if mark is not None and mark[0] > generation:
                    return ClaimStatus.CANCELLED
            if key in self._done:
                return ClaimStatus.DONE
            if self._leases.get(key, -1) > now_ms:
                return ClaimStatus.BUSY
            self._leases[key] = now_ms + lease_ms
            return ClaimStatus.CLAIMED

    def complete(self, key: str, *, now_ms: int) -> None:
        with self._lock:
            self._check_open()
            self._leases.pop(key, None)
            self._done[key] = now_ms

    def release(self, key: str) -> None:
        with self._lock:
            self._check_open()
            self._leases.pop(key, None)

    def cancel(
        self, key: str, *, now_ms: int, generation: int = CANCELLED_GENERATION
    ) -> CancelStatus:
        return self.cancel_batch([Cancel(key, now_ms, generation)])[0]

    def cancel_batch(self, ops: Sequence[Cancel]) -> list[CancelStatus]:
        """``ops`` in order, under one lock (atomic against claims)."""
        for op in ops:
            check_cancel(op)
        with self._lock:
            self._check_open()
            return [self._cancel(op) for op in ops]

    def _cancel(self, op: Cancel) -> CancelStatus:
        key = op.key
        if key in self._done:
            return CancelStatus.ALREADY_HANDLED
        lease = self._leases.get(key)
        if lease is not None and lease > op.now_ms:
            return CancelStatus.IN_PROGRESS
        mark = self._marks.get(key)
        if mark is not None and mark[0] >= CANCELLED_GENERATION:
            return CancelStatus.ALREADY_CANCELLED
        if mark is not None and mark[0] >= op.generation:
            return CancelStatus.OUTDATED
        self._marks[key] = (op.generation, op.now_ms)
        known = mark is not None or lease is not None
        self._leases.pop(key, None)  # a run-out claim: its consumer is presumed gone
        return CancelStatus.CANCELLED if known else CancelStatus.UNKNOWN

    def uncancel_batch(
        self, keys: Sequence[str], *, now_ms: int, look_only: bool = False
    ) -> list[UncancelStatus]:
        """Remove cancels' marks of ``keys``, under the claims' lock (see
        :mod:`delayq.stores.uncancel`); ``look_only``: say what each key is, remove nothing."""
        check_uncancel(keys, now_ms)
        with self._lock:
            self._check_open()
            return [self._uncancel(key, now_ms, look_only) for key in keys]

    def _uncancel(self, key: str, now_ms: int, look_only: bool) -> UncancelStatus:
        generation = self._marks.get(key, (0, 0))[0]
        done = self._done.get(key)
        status = uncancel_status(
            done, self._leases.get(key, 0), generation, now_ms=now_ms, look_only=look_only
        )
        if status is UncancelStatus.UNCANCELLED:
            self._marks.pop(key, None)
            self._leases.pop(key, None)
        return status

    def done_keys(self) -> Iterator[tuple[str, int]]:
        """Every completed key and when (see :func:`delayq.stores.key_scope.copy_unscoped_keys`)."""
        with self._lock:
            self._check_open()
            done = list(self._done.items())
        yield from done

    def prune(self, *, older_than_ms: int) -> int:
        """Forget keys completed, claims run out, and marks made before ``older_than_ms``."""
        with self._lock:
            self._check_open()
            old = [k for k, at in self._done.items() if at < older_than_ms]
            for key in old:
                del self._done[key]
            expired = [k for k, until in self._leases.items() if until < older_than_ms]
            for key in expired:
                del self._leases[key]
            stale = [k for k, (_, at) in self._marks.items() if at < older_than_ms]
            for key in stale:
                del self._marks[key]
            return len(old) + len(expired) + len(stale)

    def close(self) -> None:
        """Forget every key; the store refuses any further call."""
        with self._lock:
            self._closed = True
            self._done.clear()
            self._leases.clear()
            self._marks.clear()
