"""Undoing a cancel: an operator's override, for a cancelled message replayed from a DLQ.

A cancel's mark stops every copy of its key (see ``docs/concepts/cancel.md``). When an
operator means a cancelled message to run after all (``delayq dlq replay --uncancel``),
the store removes the mark first, atomically against claims like the cancel itself:
only a cancel's mark is removed; a done key, a live claim and a reschedule's mark (whose
new copy is the live one) are left as they are, and each key's answer says what it was.

>>> from delayq import InMemoryStore
>>> store = InMemoryStore()
>>> store.cancel("order-42", now_ms=0)
<CancelStatus.UNKNOWN: 'unknown'>
>>> store.uncancel_batch(["order-42", "order-43"], now_ms=10)
[<UncancelStatus.UNCANCELLED: 'uncancelled'>, <UncancelStatus.NOT_CANCELLED: 'not cancelled'>]
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from delayq.errors import DelayqError, InvalidInput
from delayq.stores.base import CANCELLED_GENERATION, store_error

__all__ = [
    "UncancelStatus",
    "UncancellingStore",
    "check_uncancel",
    "run_uncancels",
    "uncancel_status",
]


class UncancelStatus(str, enum.Enum):
    """What an uncancel found for a key (and did: only ``uncancelled`` changed anything)."""

    UNCANCELLED = "uncancelled"
    """The key was cancelled; its mark is removed: the next copy is claimed as usual."""
    CANCELLED = "cancelled"
    """(Looking only.) The key is cancelled: a copy would be skipped."""
    RESCHEDULED = "rescheduled"
    """A reschedule's mark, left as it is: its new copy is the live one, and a copy of an
    older generation is still skipped."""
    IN_PROGRESS = "in progress"
    """A consumer holds a live claim on the key: its handler is running."""
    ALREADY_HANDLED = "already handled"
    """The key is done: a copy would be skipped as a duplicate."""
    NOT_CANCELLED = "not cancelled"
    """No mark, no claim: a copy is claimed as usual."""

    @property
    def skipped(self) -> bool:
        """Whether a copy of the key (generation 0) delivered now would not be handled."""
        return self in (
            UncancelStatus.CANCELLED,
            UncancelStatus.RESCHEDULED,
            UncancelStatus.ALREADY_HANDLED,
        )


def uncancel_status(
    done_at: int | None, lease_until: int, generation: int, *, now_ms: int, look_only: bool
) -> UncancelStatus:
    """The answer for a key's record (``UNCANCELLED``: the caller removes the record). A
    cancel's mark never holds a live lease (a cancel ends it; a claim meeting the mark
    takes none), and a done key is never uncancelled (its handler ran)."""
    if done_at is not None:
        return UncancelStatus.ALREADY_HANDLED
    if generation >= CANCELLED_GENERATION:
        return UncancelStatus.CANCELLED if look_only else UncancelStatus.UNCANCELLED
    if lease_until > now_ms:
        return UncancelStatus.IN_PROGRESS
    if generation > 0:
        return UncancelStatus.RESCHEDULED
    return UncancelStatus.NOT_CANCELLED


@runtime_checkable
class UncancellingStore(Protocol):
    """A store that can remove cancel marks (all four of delayq's)."""

    def uncancel_batch(
        self, keys: Sequence[str], *, now_ms: int, look_only: bool = False
    ) -> list[UncancelStatus]:
        """Each key's answer, in order, in one round trip; with ``look_only`` nothing is
        removed (a cancelled key answers ``cancelled``)."""
        ...


def check_uncancel(keys: Sequence[str], now_ms: int) -> None:
    """:class:`~delayq.errors.InvalidInput` unless every key is a non-empty str and
    ``now_ms`` epoch milliseconds."""
    if isinstance(keys, (str, bytes)):
        raise InvalidInput(f"uncancel takes a list of keys, not the string {keys!r}")
    for key in keys:
        if not isinstance(key, str) or not key:
            raise InvalidInput(f"an uncancel needs non-empty str keys, not {key!r}")
    if isinstance(now_ms, bool) or not isinstance(now_ms, int) or now_ms < 0:
        raise InvalidInput(f"now_ms is epoch milliseconds (an int >= 0), not {now_ms!r}")


def run_uncancels(
    store: object, keys: Sequence[str], *, now_ms: int, look_only: bool = False
) -> list[UncancelStatus]:
    """``keys`` (checked first) in one batch; :class:`~delayq.errors.InvalidInput` for a
    store that cannot uncancel, :class:`~delayq.errors.StoreError` when its client fails."""
    if not isinstance(store, UncancellingStore):
        raise InvalidInput(
            f"{store!r} cannot remove cancel marks (it has no uncancel_batch): use one of "
            "delayq's stores (InMemoryStore, SQLiteStore, RedisStore, PostgresStore)"
        )
    check_uncancel(keys, now_ms)
    try:
        return store.uncancel_batch(keys, now_ms=now_ms, look_only=look_only)
    except DelayqError:
        raise
    except Exception as exc:
        raise store_error(store, exc) from exc
