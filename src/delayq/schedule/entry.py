"""An entry of the schedule index: one message delayq scheduled, and the states it moves
through. Pure: the stores keep entries, the publishers and consumers move them.

>>> moves(State.PENDING, State.SCHEDULED), moves(State.HANDLED, State.SCHEDULED)
(True, False)
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from delayq.errors import InvalidInput

__all__ = [
    "FIELDS",
    "FINISHED",
    "MAX_MS",
    "WAITING",
    "Entry",
    "Restore",
    "State",
    "allowed_from",
    "checked_labels",
    "moves",
    "unchecked",
]


class State(str, enum.Enum):
    """Where a scheduled message is."""

    PENDING = "pending"
    """Recorded before its publish; not confirmed yet (never shown as scheduled)."""
    SCHEDULED = "scheduled"
    """Confirmed by the broker: waiting in its tier."""
    RESCHEDULED = "rescheduled"
    """Waiting at a new due time (a newer copy; the older copy is cancelled)."""
    UNCONFIRMED = "unconfirmed"
    """Its publish was refused or never confirmed: the broker may or may not hold it."""
    CANCELLED = "cancelled"
    """Cancelled while waiting: its copy, when due, is acked unhandled."""
    PROMOTED = "promoted"
    """Sent to its destinations now; the waiting copy meets the consumer's record."""
    DELIVERED = "delivered"
    """A consumer took a copy (its handler runs)."""
    HANDLED = "handled"
    """A handler finished with it."""
    DEAD_LETTERED = "dead-lettered"
    """It ended in a dead-letter queue."""


WAITING = frozenset({State.SCHEDULED, State.RESCHEDULED})
"""What ``delayq scheduled list`` shows by default: confirmed and not yet due or taken."""

FINISHED = frozenset({State.UNCONFIRMED, State.CANCELLED, State.HANDLED, State.DEAD_LETTERED})
"""States an entry leaves only by expiring (the retention)."""

_TAKEN = frozenset({State.DELIVERED, State.HANDLED, State.DEAD_LETTERED})

_FROM: Mapping[State, frozenset[State]] = MappingProxyType(
    {
        State.PENDING: frozenset(),
        State.SCHEDULED: frozenset({State.PENDING}),
        State.UNCONFIRMED: frozenset({State.PENDING}),
        State.RESCHEDULED: WAITING | {State.PENDING, State.UNCONFIRMED},
        State.CANCELLED: WAITING | {State.PENDING, State.UNCONFIRMED},
        State.PROMOTED: WAITING,
        # A consumer's word beats the publisher's: a copy it saw was on the broker,
        # even if the confirm is still on its way or was lost.
        State.DELIVERED: WAITING | {State.PENDING, State.UNCONFIRMED, State.PROMOTED},
        State.HANDLED: WAITING
        | {State.PENDING, State.UNCONFIRMED, State.PROMOTED, State.DELIVERED},
        State.DEAD_LETTERED: WAITING
        | {State.PENDING, State.UNCONFIRMED, State.PROMOTED, State.DELIVERED},
    }
)
"""For each state, the states an entry may move to it from: an entry moves forward only,
so two processes reporting out of order (a confirm after the delivery) cannot undo each
other; a store applies each move only where the entry's current state allows it."""


MAX_MS = 10**15
"""Above every time, size and generation an entry holds (the year 33658 in epoch ms):
what every store keeps exactly and sorts as it should (Redis: 15 digits)."""


def allowed_from(to: State) -> frozenset[State]:
    """The states an entry may be in to move to ``to``."""
    return _FROM[to]


def moves(current: State, to: State) -> bool:
    """Whether an entry in ``current`` may move to ``to``."""
    return current in _FROM[to]


def checked_labels(value: object) -> Mapping[str, str]:
    """``value`` as an entry's labels (a read-only mapping of str to str), or
    :class:`~delayq.errors.InvalidInput`."""
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise InvalidInput(f"labels are a mapping of str to str, not {value!r}")
    return MappingProxyType(dict(value))


@dataclass(frozen=True)
class Entry:
    """One scheduled message, as the index keeps it (times in epoch milliseconds)."""

    id: str
    namespace: str
    routing_key: str
    due_at_ms: int
    tier: str
    published_at_ms: int
    size: int
    destinations: tuple[str, ...] = ()
    business_key: str | None = None
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    state: State = State.PENDING
    generation: int = 0
    changed_at_ms: int = 0
    body: bytes | None = None
    """Kept when the index keeps bodies (under its size cap): ``reschedule`` by id."""
    content_type: str | None = None
    headers: Mapping[str, Any] | None = None
    """The publisher's own headers, kept with the body (``None``: not kept)."""
    delay_ms: int | None = None
    """The delay its publisher asked for (the tier is the smallest at or above it): what a
    ladder recommendation fits. ``None`` where not known (an entry an older delayq wrote);
    0 for a DLQ replay's copy (sent at once). A reschedule keeps the first publish's."""

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise InvalidInput(f"an entry's id is a non-empty str, not {self.id!r}")
        for name in ("due_at_ms", "published_at_ms", "size", "generation", "changed_at_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_MS:
                raise InvalidInput(
                    f"an entry's {name} is an int from 0 to {MAX_MS - 1}, not {value!r}"
                )
        if self.delay_ms is not None and (
            isinstance(self.delay_ms, bool)
            or not isinstance(self.delay_ms, int)
            or not 0 <= self.delay_ms < MAX_MS
        ):
            raise InvalidInput(
                f"an entry's delay_ms is None or an int from 0 to {MAX_MS - 1}, "
                f"not {self.delay_ms!r}"
            )
        if not isinstance(self.state, State):
            raise InvalidInput(f"an entry's state is a State, not {self.state!r}")
        if self.body is not None and not isinstance(self.body, bytes):
            raise InvalidInput(f"an entry's body is bytes or None, not {type(self.body)!r}")
        object.__setattr__(self, "destinations", tuple(self.destinations))
        object.__setattr__(self, "labels", checked_labels(self.labels))
        if self.headers is not None:
            if not isinstance(self.headers, Mapping):
                raise InvalidInput(f"an entry's headers are a mapping, not {self.headers!r}")
            object.__setattr__(self, "headers", MappingProxyType(dict(self.headers)))

    def moved(self, to: State, now_ms: int, **changes: object) -> Entry:
        """This entry in state ``to`` (the caller checked :func:`moves` and the values:
        :func:`delayq.schedule.base.check_move`)."""
        return unchecked(**{**self.__dict__, "state": to, "changed_at_ms": now_ms, **changes})

    @property
    def kept(self) -> bool:
        """Whether its body and headers are kept: it can be sent again by its id alone."""
        return self.body is not None and self.headers is not None

    @property
    def waiting(self) -> bool:
        return self.state in WAITING

    @property
    def taken(self) -> bool:
        """A consumer saw a copy of it."""
        return self.state in _TAKEN


FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Entry))
"""An entry's fields in order: the stores' column names, and the order :class:`Restore`
reads a row in."""

_STATES = {s.value: s for s in State}


def unchecked(**values: Any) -> Entry:
    """An entry of every field in ``values`` as :class:`Entry` keeps them (destinations a
    tuple, labels and headers read-only mappings), built without its checks: for values
    delayq made or checked itself (a publisher's messages, a store's rows)."""
    entry = object.__new__(Entry)
    entry.__dict__.update(values)
    return entry


class Restore:
    """Entries rebuilt from a store's own rows (values in :data:`FIELDS` order, labels,
    destinations and headers as JSON text or already decoded), without the checks an
    entry passed when it was added, and each distinct labels or destinations text
    decoded once: a page of 1,000 entries costs a few milliseconds, not tens."""

    __slots__ = ("_destinations", "_labels")

    def __init__(self) -> None:
        self._labels: dict[object, Mapping[str, str]] = {}
        self._destinations: dict[object, tuple[str, ...]] = {}

    def __call__(self, row: Sequence[Any]) -> Entry:
        (id_, namespace, routing_key, due_at_ms, tier, published_at_ms, size, destinations,
         business_key, labels, state, generation, changed_at_ms, body, content_type,
         headers, delay_ms) = row  # fmt: skip
        key: object = destinations if isinstance(destinations, str) else tuple(destinations)
        found = self._destinations.get(key)
        if found is None:
            values: Sequence[str] = (
                json.loads(destinations) if isinstance(destinations, str) else destinations
            )
            found = tuple(values)
            if len(self._destinations) < 4096:
                self._destinations[key] = found
        kept = self._labels.get(labels) if isinstance(labels, str) else None
        if kept is None:
            kept = MappingProxyType(json.loads(labels) if isinstance(labels, str) else dict(labels))
            if isinstance(labels, str) and len(self._labels) < 4096:
                self._labels[labels] = kept
        if isinstance(headers, str):
            headers = json.loads(headers)
        return unchecked(
            id=id_, namespace=namespace, routing_key=routing_key, due_at_ms=due_at_ms,
            tier=tier, published_at_ms=published_at_ms, size=size, destinations=found,
            business_key=business_key, labels=kept, state=_STATES[state],
            generation=generation, changed_at_ms=changed_at_ms,
            body=body if body is None or isinstance(body, bytes) else bytes(body),
            content_type=content_type,
            headers=None if headers is None else MappingProxyType(dict(headers)),
            delay_ms=delay_ms,
        )  # fmt: skip
