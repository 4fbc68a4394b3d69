"""Idempotency stores: claim a key before the handler runs, record it after.

Delivery is at least once (a redelivery after a crash, a re-sent publish whose
confirm was lost, a republish-then-ack cut in the middle), so a side effect
happens once only when the handler is idempotent. A store makes it so: the
consumer claims the message's key (the handler's business key, else the message
id) before running the handler, completes it after success and releases it on
failure. A claim has a lease, so a crashed consumer's claim expires; completed
keys are kept for a retention period and then pruned.

The same record carries cancellation (see ``docs/concepts/cancel.md``): a
:class:`Cancel` marks a key so that its claim answers
:attr:`ClaimStatus.CANCELLED`, atomically against claims, and a key's
*generation* (a reschedule's) makes copies of older generations cancelled.

>>> from delayq import InMemoryStore
>>> store = InMemoryStore()
>>> store.claim("order-42", lease_ms=60_000, now_ms=0)
<ClaimStatus.CLAIMED: 'claimed'>
>>> store.complete("order-42", now_ms=10)
>>> store.claim("order-42", lease_ms=60_000, now_ms=20)
<ClaimStatus.DONE: 'done'>
"""

from __future__ import annotations

import enum
import functools
import inspect
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from delayq.errors import DelayqError, InvalidInput, StoreError
from delayq.scrub import scrub

__all__ = [
    "CANCELLED_GENERATION",
    "BatchingStore",
    "Cancel",
    "CancelStatus",
    "CancellingStore",
    "Claim",
    "ClaimStatus",
    "Complete",
    "IdempotencyStore",
    "Release",
    "StoreOp",
    "TransactionalStore",
    "answer_op",
    "call_in_transaction",
    "check_cancel",
    "check_generation",
    "check_transactional",
    "closed_error",
    "run_cancels",
    "run_ops",
    "store_error",
    "supports_transactions",
]


class ClaimStatus(str, enum.Enum):
    CLAIMED = "claimed"
    """The caller holds the key now: run the handler, then complete or release."""
    DONE = "done"
    """The key was handled before: skip, it is a duplicate."""
    BUSY = "busy"
    """Another consumer holds a live lease on the key: try again later."""
    CANCELLED = "cancelled"
    """The key is cancelled, or this copy's generation is older than the key's (it was
    rescheduled): skip it, never to be handled."""


CANCELLED_GENERATION = 2**53
"""The generation a cancel gives a key: above every copy's, so every copy is cancelled.
Rescheduled copies carry generations from 1 up to below it (0: never rescheduled);
2**53 is exact in a Lua number (Redis scripts) and a JSON one."""


class CancelStatus(str, enum.Enum):
    """What a :class:`Cancel` found and did, atomically against claims of its key."""

    CANCELLED = "cancelled"
    """The store knew the key (a claim given back or run out, an earlier reschedule):
    it is marked now, no copy of an older generation will be handled."""
    UNKNOWN = "unknown"
    """The store had no record of the key (the usual answer for a message still
    parked: consumers record a key when a copy arrives): the mark waits for it."""
    ALREADY_CANCELLED = "already cancelled"
    """The key was cancelled before (it stays cancelled; a reschedule is refused)."""
    IN_PROGRESS = "in progress"
    """A consumer holds a live claim on the key: its handler is running; nothing changed."""
    ALREADY_HANDLED = "already handled"
    """The key is done: nothing changed."""
    OUTDATED = "outdated"
    """A reschedule whose generation is not above the key's: a newer reschedule holds
    the key; nothing changed (do not publish this reschedule's copy)."""

    @property
    def marked(self) -> bool:
        """Whether the key carries this operation's mark now (its older copies will not run)."""
        return self in (CancelStatus.CANCELLED, CancelStatus.UNKNOWN)


def check_generation(value: object, *, cancel: bool = False) -> int:
    """``value`` as a generation: an int from 1 to below :data:`CANCELLED_GENERATION`
    (or equal to it with ``cancel``); :class:`~delayq.errors.InvalidInput` otherwise."""
    top = CANCELLED_GENERATION if cancel else CANCELLED_GENERATION - 1
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
        raise InvalidInput(
            f"a generation is a whole number from 1 to {top} (a reschedule's, above the "
            f"key's current one), not {value!r}"
        )
    return value


@runtime_checkable
class IdempotencyStore(Protocol):
    """What a consumer needs from a store. Times are epoch milliseconds."""

    blocking: bool
    """True when calls do I/O (the async consumer then runs them in a thread)."""

    def claim(self, key: str, *, lease_ms: int, now_ms: int) -> ClaimStatus:
        """A store that is also a :class:`CancellingStore` takes ``generation=`` too."""
        ...

    def complete(self, key: str, *, now_ms: int) -> None: ...

    def release(self, key: str) -> None: ...

    def prune(self, *, older_than_ms: int) -> int:
        """Forget keys completed before ``older_than_ms`` (and expired claims)."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Claim:
    key: str
    lease_ms: int
    now_ms: int
    generation: int = 0
    """The copy's generation (:data:`~delayq.message.envelope.H_GENERATION`; 0 for a
    message never rescheduled): below the key's, the claim answers CANCELLED."""

    @property
    def lease_until_ms(self) -> int:
        """When this claim's lease ends; also the claim's fencing value in a transaction."""
        return self.now_ms + self.lease_ms


@dataclass(frozen=True, slots=True)
class Complete:
    key: str
    now_ms: int


@dataclass(frozen=True, slots=True)
class Release:
    key: str


StoreOp = Claim | Complete | Release
"""One store operation; the async consumer sends those of one event-loop turn together."""


@dataclass(frozen=True, slots=True)
class Cancel:
    """Mark ``key`` so that copies of a generation below ``generation`` are never handled.

    With the default, :data:`CANCELLED_GENERATION`, it is a cancel (every copy); with a
    smaller one, a reschedule's: the copy published with ``generation`` is the live one.
    A key done answers ALREADY_HANDLED, one under a live claim IN_PROGRESS; neither is
    changed. ``now_ms`` is when: a claim's lease is live if it ends after it, and the mark
    is pruned like a completed key, ``retention`` after it.
    """

    key: str
    now_ms: int
    generation: int = CANCELLED_GENERATION


@runtime_checkable
class CancellingStore(Protocol):
    """A store that keeps cancellations (all four of delayq's): ``claim`` then takes a
    ``generation`` and may answer :attr:`ClaimStatus.CANCELLED`."""

    def cancel(
        self, key: str, *, now_ms: int, generation: int = CANCELLED_GENERATION
    ) -> CancelStatus: ...

    def cancel_batch(self, ops: Sequence[Cancel]) -> list[CancelStatus]:
        """``ops`` in order, in one round trip (a pipeline, a transaction)."""
        ...


@runtime_checkable
class BatchingStore(Protocol):
    """A store that performs several operations in one round trip (one transaction,
    one pipeline), in order; the result list has a :class:`ClaimStatus` per
    :class:`Claim` and ``None`` per other operation. If it raises, none of the
    operations may be assumed done."""

    def run_batch(self, ops: Sequence[StoreOp]) -> list[ClaimStatus | None]: ...


@runtime_checkable
class TransactionalStore(Protocol):
    """A store that can complete a key in the same database transaction as the
    handler's own writes: the *inbox* pattern, so that a crash anywhere leaves
    either both (the key is done: a redelivery is skipped) or neither (the claim's
    lease runs out and the handler runs again from scratch).

    ``transaction`` opens a transaction on a connection of its own and yields that
    connection (``sqlite3.Connection``, ``psycopg.Connection``) for the handler's
    writes. On a clean exit it marks ``key`` done, if the caller's claim (the one
    whose lease ends at ``lease_until_ms``) still holds, and commits; if the claim
    is gone it raises :class:`~delayq.errors.ClaimLost` and rolls back; on an
    exception it rolls back. The handler must not commit or roll back itself.
    """

    def transaction(
        self, key: str, *, lease_until_ms: int, now_ms: int
    ) -> AbstractContextManager[Any]: ...


def supports_transactions(store: object) -> bool:
    return isinstance(store, TransactionalStore)


def apply_op(store: IdempotencyStore, op: StoreOp) -> ClaimStatus | None:
    if isinstance(op, Claim):
        if op.generation:  # only a rescheduled copy's: a store without cancels never sees it
            return store.claim(  # type: ignore[call-arg]
                op.key, lease_ms=op.lease_ms, now_ms=op.now_ms, generation=op.generation
            )
        return store.claim(op.key, lease_ms=op.lease_ms, now_ms=op.now_ms)
    if isinstance(op, Complete):
        store.complete(op.key, now_ms=op.now_ms)
    else:
        store.release(op.key)
    return None


@functools.lru_cache(maxsize=64)
def _batches(store_type: type) -> bool:
    """Whether a store class has ``run_batch`` (a Protocol ``isinstance`` check costs tens
    of microseconds: too much to pay per delivery)."""
    return callable(getattr(store_type, "run_batch", None))


def run_ops(store: IdempotencyStore, ops: Sequence[StoreOp]) -> list[ClaimStatus | None]:
    """``ops`` in order, in one batch when the store can, else one by one.

    A failure of the store's client (server down, disk full) is raised as
    :class:`~delayq.errors.StoreError`, the client's error in ``__cause__``.
    """
    try:
        if _batches(type(store)):
            return store.run_batch(ops)  # type: ignore[attr-defined, no-any-return]
        return [apply_op(store, op) for op in ops]
    except DelayqError:
        raise
    except Exception as exc:
        raise store_error(store, exc) from exc


def run_cancels(store: object, ops: Sequence[Cancel]) -> list[CancelStatus]:
    """``ops`` (checked first) in one batch; :class:`~delayq.errors.InvalidInput` for a
    store that keeps no cancellations, :class:`StoreError` when its client fails."""
    if not isinstance(store, CancellingStore):
        raise InvalidInput(
            f"{store!r} keeps no cancellations (it has no cancel_batch): use one of "
            "delayq's stores (InMemoryStore, SQLiteStore, RedisStore, PostgresStore)"
        )
    for op in ops:
        if not isinstance(op, Cancel):
            raise InvalidInput(f"cancel_batch takes Cancel operations, not {op!r}")
        check_cancel(op)
    try:
        return store.cancel_batch(ops)
    except DelayqError:
        raise
    except Exception as exc:
        raise store_error(store, exc) from exc


def check_cancel(op: Cancel) -> Cancel:
    """``op`` if its fields are usable; :class:`~delayq.errors.InvalidInput` otherwise
    (an empty key would mark every message without a key; a bad time never expires)."""
    if not isinstance(op.key, str) or not op.key:
        raise InvalidInput(f"a cancel needs a non-empty str key, not {op.key!r}")
    if isinstance(op.now_ms, bool) or not isinstance(op.now_ms, int) or op.now_ms < 0:
        raise InvalidInput(f"now_ms is epoch milliseconds (an int >= 0), not {op.now_ms!r}")
    check_generation(op.generation, cancel=True)
    return op


def answer_op(store: IdempotencyStore, op: StoreOp) -> ClaimStatus | StoreError | None:
    """What :func:`run_ops` gives for ``op`` alone, or its :class:`StoreError` (the answer
    a delivery flow is sent for a store step: see :mod:`delayq.consume.flow`)."""
    try:
        return run_ops(store, [op])[0]
    except StoreError as exc:
        return exc


def closed_error(store: object) -> StoreError:
    return StoreError(
        f"{store!r} is closed: make a new store (a consumer never closes the store it is "
        "given, so close it only when every consumer using it has stopped)"
    )


def store_error(store: object, exc: BaseException) -> StoreError:
    # Logged by the consumers: a client's error may quote its DSN, password included.
    return StoreError(scrub(f"idempotency store {store!r} failed: {type(exc).__name__}: {exc}"))


def call_in_transaction(
    store: TransactionalStore,
    handler: Callable[[Any, Any], object],
    value: Any,
    *,
    key: str,
    lease_until_ms: int,
    now_ms: int,
) -> None:
    """Run a transactional handler: ``handler(value, tx)`` inside ``store.transaction``."""
    with store.transaction(key, lease_until_ms=lease_until_ms, now_ms=now_ms) as tx:
        handler(value, tx)


def check_transactional(store: object, handler: Callable[..., Any]) -> None:
    """Refuse, before consuming, a transactional consumer that could not keep its promise."""
    if store is None or not supports_transactions(store):
        raise InvalidInput(
            f"transactional=True needs a store that commits the handler's writes with the "
            f"key (SQLiteStore or PostgresStore), not {store!r}"
        )
    if inspect.iscoroutinefunction(handler):
        raise InvalidInput(
            "a transactional handler is a plain function `handler(body, tx)`: it runs in a "
            "thread with the transaction's connection"
        )
