"""The in-memory idempotency store: for tests and single-process tools."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from delayq.stores.base import ClaimStatus, closed_error

__all__ = ["InMemoryStore"]


class InMemoryStore:
    """A store in this process's memory: for tests and single-process tools."""

    blocking = False

    def __init__(self) -> None:
        self._done: dict[str, int] = {}
        self._leases: dict[str, int] = {}
        self._lock = threading.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"InMemoryStore(keys={len(self._done)})"

    def _check_open(self) -> None:
        if self._closed:
            raise closed_error(self)

    def claim(self, key: str, *, lease_ms: int, now_ms: int) -> ClaimStatus:
        with self._lock:
            self._check_open()
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

    def done_keys(self) -> Iterator[tuple[str, int]]:
        """Every completed key and when (see :func:`delayq.stores.key_scope.copy_unscoped_keys`)."""
        with self._lock:
            self._check_open()
            done = list(self._done.items())
        yield from done

    def prune(self, *, older_than_ms: int) -> int:
        with self._lock:
            self._check_open()
            old = [k for k, at in self._done.items() if at < older_than_ms]
            for key in old:
                del self._done[key]
            expired = [k for k, until in self._leases.items() if until < older_than_ms]
            for key in expired:
                del self._leases[key]
            return len(old) + len(expired)

    def close(self) -> None:
        """Forget every key; the store refuses any further call."""
        with self._lock:
            self._closed = True
            self._done.clear()
            self._leases.clear()
