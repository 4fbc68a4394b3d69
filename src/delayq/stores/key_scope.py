"""Whose keys an idempotency store keeps apart: each queue's own, by default.

A message fanned out to two queues (``billing`` and ``shipping`` both bind
``order.paid``) has one message id and one business key, but two handlers that
must each run once. So a consumer stores its keys in its queue's scope:

* :attr:`KeyScope.QUEUE` (the default) stores ``q:<queue>:<key>``, the queue name
  percent-encoded (``urllib.parse.quote`` with no safe characters), so it never
  holds a ``:`` and the first ``:`` after ``q:`` ends it, whatever the queue name
  or the key contain;
* :attr:`KeyScope.SHARED` stores the key as is (delayq 0.1's form): one key
  space for every consumer of the store, for handlers that deliberately perform
  the same effect from several queues.

>>> scoped_key("order-42", "billing", KeyScope.QUEUE)
'q:billing:order-42'
>>> scoped_key("order-42", "billing", KeyScope.SHARED)
'order-42'

Upgrading from 0.1, whose keys are all unscoped: queue-scoped consumers neither
read nor write them, and they are pruned after the retention period like any
key. :func:`copy_unscoped_keys` marks them done in the scopes of the queues you
name (run it with the 0.1 consumers stopped, before starting the new ones).
0.1 never recorded which queue handled a key, so for a store that fan-out
queues shared, the copy cannot tell them apart: it is exact for a store one
queue used, and for a shared one it keeps 0.1's skip for the messages published
before the upgrade in every queue named.
"""

from __future__ import annotations

import enum
import functools
import time
from collections.abc import Iterable, Iterator
from typing import Protocol, runtime_checkable
from urllib.parse import quote

from delayq.errors import InvalidInput
from delayq.stores.base import Claim, ClaimStatus, Complete, IdempotencyStore, StoreOp, run_ops

__all__ = [
    "QUEUE_SCOPE_PREFIX",
    "KeyScope",
    "ListingStore",
    "copy_unscoped_keys",
    "is_queue_scoped",
    "scoped_key",
]

QUEUE_SCOPE_PREFIX = "q:"
"""What every queue-scoped key starts with."""

_BATCH = 500
_MIGRATION_LEASE_MS = 60_000


class KeyScope(str, enum.Enum):
    """Which consumers of one idempotency store see each other's keys."""

    QUEUE = "queue"
    """Each queue its own keys (the default): a message fanned out to several queues
    is handled once in each, and a redelivery in one queue is still a duplicate."""
    SHARED = "shared"
    """One key space for every consumer of the store (0.1's behaviour): a key done in
    one queue is a duplicate in all. Only for handlers that do the same effect."""

    @classmethod
    def parse(cls, value: object) -> KeyScope:
        """``value`` as a scope; :class:`~delayq.errors.InvalidInput` for anything else."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                return cls(value)
            except ValueError:
                pass
        accepted = ", ".join(f'"{scope.value}"' for scope in cls)
        raise InvalidInput(
            f"key_scope must be KeyScope.QUEUE or KeyScope.SHARED ({accepted}), not {value!r}"
        )


def scoped_key(key: str, queue: str, scope: KeyScope) -> str:
    """The form ``key`` takes in the store for a consumer of ``queue``."""
    if scope is KeyScope.SHARED:
        return key
    return f"{_queue_prefix(queue)}{key}"


@functools.lru_cache(maxsize=256)
def _queue_prefix(queue: str) -> str:
    """``q:<queue, quoted>:`` (quoted once per queue, not per delivery)."""
    return f"{QUEUE_SCOPE_PREFIX}{quote(queue, safe='')}:"


def is_queue_scoped(stored: str) -> bool:
    """Whether a stored key has the queue-scoped form (0.1 keys do not, unless a
    business key happened to look like ``q:<name>:...``)."""
    head, sep, _ = stored[len(QUEUE_SCOPE_PREFIX) :].partition(":")
    return stored.startswith(QUEUE_SCOPE_PREFIX) and bool(sep) and bool(head)


@runtime_checkable
class ListingStore(Protocol):
    """A store that can list its completed keys (all four of delayq's can)."""

    def done_keys(self) -> Iterator[tuple[str, int]]:
        """Every completed key and when it was completed (epoch ms), in pages."""
        ...


def copy_unscoped_keys(
    store: IdempotencyStore, queues: Iterable[str], *, now_ms: int | None = None
) -> int:
    """Mark every completed unscoped (0.1) key of ``store`` done in the scope of each
    of ``queues``, with its original completion time (so it is pruned when the
    original would have been; a ``RedisStore`` with ``retention_ms`` counts its TTL
    from the copy). Returns how many scoped keys it wrote.

    A scoped key that already exists is left as it is (done, or claimed by a
    running consumer), so running it twice, or beside new consumers, is safe.
    """
    if isinstance(queues, str) or not isinstance(queues, Iterable):
        raise InvalidInput(f"queues must be a list of queue names, not {queues!r}")
    names = list(queues)
    if not names or not all(isinstance(q, str) and q for q in names):
        raise InvalidInput(f"queues must be a non-empty list of queue names, not {names!r}")
    if not isinstance(store, ListingStore):
        raise InvalidInput(
            f"{store!r} cannot list its keys (it has no done_keys()): copy them with the "
            "store's own tools into the form scoped_key(key, queue, KeyScope.QUEUE)"
        )
    now = int(time.time() * 1000) if now_ms is None else now_ms
    written = 0
    page: list[tuple[str, int]] = []
    for key, done_at in store.done_keys():
        if is_queue_scoped(key):
            continue
        page.extend((scoped_key(key, queue, KeyScope.QUEUE), done_at) for queue in names)
        if len(page) >= _BATCH:
            written += _copy(store, page, now)
            page = []
    if page:
        written += _copy(store, page, now)
    return written


def _copy(store: IdempotencyStore, page: list[tuple[str, int]], now_ms: int) -> int:
    """Claim each target first: only a key nobody holds is completed."""
    claims: list[StoreOp] = [Claim(key, _MIGRATION_LEASE_MS, now_ms) for key, _ in page]
    statuses = run_ops(store, claims)
    won = [
        (key, done_at)
        for (key, done_at), status in zip(page, statuses, strict=True)
        if status is ClaimStatus.CLAIMED
    ]
    if won:
        run_ops(store, [Complete(key, done_at) for key, done_at in won])
    return len(won)
