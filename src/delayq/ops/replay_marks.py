"""Cancel marks met by a DLQ replay: look them up, or clear them (the operator's override).

A message replayed from ``<queue>.dlq`` is claimed by ``<queue>``'s consumers under the
key they compute for it, so a cancel made meanwhile stops the replayed copy (see
``docs/concepts/cancel.md``). Given the consumers' store, a replay looks each message's
key up before sending it again and says which copies will be skipped; with ``uncancel``
it removes each cancel's mark first (:mod:`delayq.stores.uncancel`), so the replayed copy
is handled. Keys are computed as the consumer computes them: the message id (or what
``identity`` returns for a consumer with a ``key=`` function) in the ``key_scope``,
for the DLQ's queue (:func:`~delayq.stores.key_scope.scoped_key`).

>>> from delayq import InMemoryStore
>>> from delayq.consume.delivery import Delivery
>>> store = InMemoryStore()
>>> store.cancel("q:orders:m-1", now_ms=0)
<CancelStatus.UNKNOWN: 'unknown'>
>>> parked = Delivery(queue="orders.dlq", body=b"{}", routing_key="orders",
...                   message_id="m-1", content_type=None, headers={})
>>> marks = ReplayMarks(store, "orders", uncancel=True)
>>> marks.key_of(parked)
'q:orders:m-1'
>>> marks.before_send(parked, now_ms=1)
<UncancelStatus.UNCANCELLED: 'uncancelled'>
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from delayq.consume.delivery import Delivery
from delayq.errors import InvalidInput
from delayq.stores.key_scope import KeyScope, scoped_key
from delayq.stores.uncancel import UncancellingStore, UncancelStatus, run_uncancels
from delayq.wording import counted

__all__ = ["ReplayMarks"]


@dataclass
class ReplayMarks:
    """The store a replay consults, how ``queue``'s consumers key their messages, and
    whether to clear cancels (``uncancel``) or only look. ``found`` collects each
    replayed message id's answer."""

    store: object
    queue: str
    """The destination queue the DLQ belongs to (its consumers' key scope)."""
    uncancel: bool = False
    key_scope: KeyScope | str = KeyScope.QUEUE
    identity: Callable[[Delivery], str | None] | None = None
    """For consumers with a ``key=`` function: the business key of a parked message
    (``None``: its message id, as consumers without one key)."""
    found: dict[str, UncancelStatus] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.store, UncancellingStore):
            raise InvalidInput(
                f"{self.store!r} cannot look up or remove cancel marks: give the consumers' "
                "store (InMemoryStore, SQLiteStore, RedisStore, PostgresStore)"
            )
        if not isinstance(self.queue, str) or not self.queue:
            raise InvalidInput(f"ReplayMarks needs the DLQ's queue name, not {self.queue!r}")
        self.key_scope = KeyScope.parse(self.key_scope)

    def key_of(self, parked: Delivery) -> str | None:
        """The stored key the queue's consumers claim for ``parked``'s replayed copy."""
        name = parked.message_id if self.identity is None else self.identity(parked)
        if not name:
            return None  # no id, no key: the consumer claims nothing for it either
        return scoped_key(str(name), self.queue, KeyScope.parse(self.key_scope))

    def before_send(self, parked: Delivery, *, now_ms: int) -> UncancelStatus | None:
        """Look up (or clear) ``parked``'s cancel before it is sent again; raises
        :class:`~delayq.errors.StoreError` when the store fails (send nothing then)."""
        key = self.key_of(parked)
        if key is None:
            return None
        status = run_uncancels(self.store, [key], now_ms=now_ms, look_only=not self.uncancel)[0]
        self.found[parked.message_id or key] = status
        return status

    def ids(self, *statuses: UncancelStatus) -> list[str]:
        return [mid for mid, status in self.found.items() if status in statuses]

    def summary(self, replayed: list[str]) -> list[str]:
        """Lines for the replay's report, about the replayed messages only."""
        done = set(replayed)
        lines = []

        def line(status: UncancelStatus, text: str) -> None:
            ids = [mid for mid in self.ids(status) if mid in done]
            if ids:
                shown = ", ".join(ids[:5]) + (", ..." if len(ids) > 5 else "")
                lines.append(f"{counted(len(ids), 'message')} {text}: {shown}")

        line(UncancelStatus.UNCANCELLED, "uncancelled: their copies will be handled")
        line(
            UncancelStatus.CANCELLED,
            "cancelled: their copies will be skipped as cancelled (replay with --uncancel "
            "to run them)",
        )
        line(
            UncancelStatus.RESCHEDULED,
            "rescheduled: a copy older than the reschedule is skipped (the reschedule's "
            "own copy is the live one)",
        )
        line(UncancelStatus.ALREADY_HANDLED, "already handled: their copies will be skipped")
        line(UncancelStatus.IN_PROGRESS, "in progress on a consumer now")
        return lines
