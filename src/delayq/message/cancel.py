"""Cancelling scheduled messages, the pure part: which keys to mark, and the receipt.

A cancel marks, in the consumers' idempotency store, the very key each consumer
claims for the message (see ``docs/concepts/cancel.md``): the message id, or the
business key, in the scope of each queue the message can reach. Both publishers
plan it here, run the :class:`~delayq.stores.base.Cancel` operations on the store in
one batch, and read the answers back into :class:`CancelReceipt` objects.

>>> from delayq import Topology
>>> topology = Topology(namespace="shop", ladder=["1m"],
...     destinations=[{"queue": "billing", "bindings": ["order.*"]},
...                   {"queue": "audit", "bindings": ["#"]}])
>>> plan = plan_cancels(topology, message_ids=["m-1"], now_ms=0, routing_key="order.paid")
>>> [op.key for op in plan.ops]
['q:billing:m-1', 'q:audit:m-1']
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from delayq.errors import InvalidDelay, InvalidInput
from delayq.message.bulk import key_message_id
from delayq.message.envelope import H_GENERATION, OutgoingMessage, Receipt
from delayq.stores.base import (
    CANCELLED_GENERATION,
    Cancel,
    CancellingStore,
    CancelStatus,
    check_generation,
)
from delayq.stores.key_scope import KeyScope, scoped_key
from delayq.topology.model import Topology
from delayq.topology.topic import topic_matches

if TYPE_CHECKING:
    from delayq.message.factory import MessageFactory
    from delayq.topology.model import Strategy

__all__ = [
    "SHARED_QUEUE",
    "CancelPlan",
    "CancelReceipt",
    "Generations",
    "RescheduleReceipt",
    "Rescheduling",
    "delay_until",
    "new_copy_id",
    "one_of",
    "plan_cancels",
    "plan_reschedule",
    "stamped",
    "store_for_cancels",
    "summarise",
    "target_queues",
]

SHARED_QUEUE = "*"
"""The queue a receipt names for a key in the shared scope (one key for every queue)."""

_PRECEDENCE = (
    CancelStatus.ALREADY_HANDLED,
    CancelStatus.IN_PROGRESS,
    CancelStatus.OUTDATED,
    CancelStatus.CANCELLED,
    CancelStatus.ALREADY_CANCELLED,
    CancelStatus.UNKNOWN,
)
"""When several answers are summed up, the first of these present wins: a handler that
ran or runs anywhere is what the caller must hear about."""


def summarise(statuses: Iterable[CancelStatus]) -> CancelStatus:
    """One status for several answers (of one queue's keys, or of all queues)."""
    present = set(statuses)
    if not present:
        return CancelStatus.UNKNOWN
    return next(status for status in _PRECEDENCE if status in present)


@dataclass(frozen=True)
class CancelReceipt:
    """What a cancel of one message did, queue by queue.

    ``queues`` maps each queue to its answer (:data:`SHARED_QUEUE` in the shared scope);
    ``status`` sums them up: ``already handled`` or ``in progress`` if that is so in any
    queue, else ``unknown`` when no queue knew the key, else ``cancelled`` (or ``already
    cancelled``). :attr:`cancelled` is whether no handler ran, runs or will run for it.
    """

    message_id: str | None
    key: str | None
    queues: dict[str, CancelStatus]
    status: CancelStatus = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", summarise(self.queues.values()))

    @property
    def cancelled(self) -> bool:
        """Whether every queue's copy is cancelled now (marked, or cancelled before)."""
        stopped = (CancelStatus.CANCELLED, CancelStatus.UNKNOWN, CancelStatus.ALREADY_CANCELLED)
        return bool(self.queues) and all(s in stopped for s in self.queues.values())


@dataclass(frozen=True)
class CancelPlan:
    """The store operations of a cancel, and how to read their answers back."""

    ops: list[Cancel]
    slots: list[tuple[int, str]]
    """Per operation: which message (index into the request) and which queue."""
    requests: list[tuple[str | None, str | None]]
    """Per message: (message id, business key), as asked."""

    def receipts(self, answers: Sequence[CancelStatus]) -> list[CancelReceipt]:
        """One receipt per message asked for, from the store's answers to :attr:`ops`."""
        if len(answers) != len(self.ops):
            raise InvalidInput(f"{len(answers)} answers for {len(self.ops)} cancel operations")
        per: list[dict[str, list[CancelStatus]]] = [{} for _ in self.requests]
        for (index, queue), answer in zip(self.slots, answers, strict=True):
            per[index].setdefault(queue, []).append(answer)
        return [
            CancelReceipt(message_id, key, {q: summarise(a) for q, a in found.items()})
            for (message_id, key), found in zip(self.requests, per, strict=True)
        ]


def _names(values: object, what: str) -> list[str]:
    if values is None:
        return []
    if isinstance(values, str) or not isinstance(values, Iterable):
        raise InvalidInput(f"{what} must be a list of non-empty str, not {values!r}")
    names = list(values)
    for name in names:
        if not isinstance(name, str) or not name:
            raise InvalidInput(f"{what} must be non-empty str, not {name!r}")
    return names


def target_queues(
    topology: Topology, routing_key: str | None = None, queues: Iterable[str] | None = None
) -> list[str]:
    """The queues a message can reach: the topology's destinations whose bindings match
    ``routing_key`` (all of them without one), plus ``queues`` (bound outside the file)."""
    if routing_key is not None and not isinstance(routing_key, str):
        raise InvalidInput(f"routing_key must be a str, not {routing_key!r}")
    found = [
        dest.queue
        for dest in topology.destinations
        if routing_key is None or any(topic_matches(b, routing_key) for b in dest.bindings)
    ]
    found.extend(_names(queues, "queues"))
    return list(dict.fromkeys(found))


def plan_cancels(
    topology: Topology,
    *,
    now_ms: int,
    message_ids: Iterable[str] | None = None,
    keys: Iterable[str] | None = None,
    routing_key: str | None = None,
    queues: Iterable[str] | None = None,
    key_scope: KeyScope | str = KeyScope.QUEUE,
    generation: int = CANCELLED_GENERATION,
) -> CancelPlan:
    """The marks that cancel ``message_ids`` (for consumers keyed by message id) or
    ``keys`` (business keys: for consumers with a ``key=`` function, and for messages
    scheduled in bulk, whose id derives from the key), exactly one of the two given.
    With a ``generation`` below :data:`~delayq.stores.base.CANCELLED_GENERATION`, the
    marks are a reschedule's: copies below it are cancelled."""
    check_generation(generation, cancel=True)
    ids, business = _names(message_ids, "message_ids"), _names(keys, "keys")
    if (message_ids is None) == (keys is None):
        raise InvalidInput("give either message_ids or keys (not both, not neither)")
    scope = KeyScope.parse(key_scope)
    targets = (
        [SHARED_QUEUE] if scope is KeyScope.SHARED else target_queues(topology, routing_key, queues)
    )
    if not targets:
        raise InvalidInput(
            f"routing key {routing_key!r} reaches no destination of namespace "
            f"{topology.namespace!r}: name the queues its consumers read (queues=[...])"
        )
    requests: list[tuple[str | None, str | None]] = [(m, None) for m in ids]
    requests += [(None, k) for k in business]
    ops: list[Cancel] = []
    slots: list[tuple[int, str]] = []
    for index, (message_id, key) in enumerate(requests):
        identities = [message_id] if message_id is not None else []
        if key is not None:
            identities = [key, key_message_id(topology.namespace, key)]
        for queue in targets:
            for identity in identities:
                ops.append(Cancel(scoped_key(identity, queue, scope), now_ms, generation))
                slots.append((index, queue))
    return CancelPlan(ops, slots, requests)


def one_of(message_id: str | None, key: str | None) -> dict[str, list[str]]:
    """``cancel``'s arguments as ``cancel_many``'s: exactly one of the two, given."""
    if (message_id is None) == (key is None):
        raise InvalidInput("cancel takes message_id=... or key=... (one of them)")
    if message_id is not None:
        return {"message_ids": [message_id]}
    assert key is not None
    return {"keys": [key]}


def store_for_cancels(store: object) -> CancellingStore:
    """The publisher's store, if it keeps cancellations; else a clear error."""
    if store is None:
        raise InvalidInput(
            "cancelling needs the consumers' idempotency store: "
            "Publisher(url, topology, store=...) with the store the consumers use"
        )
    if not isinstance(store, CancellingStore):
        raise InvalidInput(
            f"{store!r} keeps no cancellations (it has no cancel_batch): use one of "
            "delayq's stores (InMemoryStore, SQLiteStore, RedisStore, PostgresStore)"
        )
    return store


@dataclass(frozen=True)
class RescheduleReceipt:
    """What a reschedule did: the older copies' answers queue by queue (``marks``), the
    new copy's ``generation``, and its publish ``receipt`` (``None``: not published, as
    no queue took the mark: already handled, in progress, cancelled, or outdated)."""

    marks: CancelReceipt
    generation: int
    receipt: Receipt | None

    @property
    def moved(self) -> bool:
        """Whether the new copy was published: in the queues whose mark took
        (``marks.queues`` says ``cancelled`` or ``unknown``) it is the one handled."""
        return self.receipt is not None


class Generations:
    """A publisher's reschedule generations: its clock in ms, kept increasing (two
    reschedules in one ms get two generations). Publishers on several hosts order
    their reschedules by their clocks; the loser of a race is told ``outdated``."""

    def __init__(self) -> None:
        self._last = 0
        self._lock = threading.Lock()

    def next(self, now_ms: int, given: int | None = None) -> int:
        """``given`` (checked), else the next generation at ``now_ms``."""
        if given is not None:
            return check_generation(given)
        with self._lock:
            self._last = max(int(now_ms), self._last + 1)
            return check_generation(self._last)


def stamped(message: OutgoingMessage, generation: int) -> OutgoingMessage:
    """``message`` carrying ``generation`` (:data:`~delayq.message.envelope.H_GENERATION`)."""
    message.headers[H_GENERATION] = generation
    return message


@dataclass(frozen=True)
class Rescheduling:
    """A reschedule planned, before any I/O: the new copy, its generation, the marks."""

    message: OutgoingMessage
    generation: int
    plan: CancelPlan

    def marks(self, answers: Sequence[CancelStatus]) -> tuple[CancelReceipt, bool]:
        """The store's answers to the marks, and whether the new copy may be published
        (some queue took the mark; if none did, the receipt says why)."""
        marks = self.plan.receipts(answers)[0]
        return marks, any(status.marked for status in marks.queues.values())

    def receipt(self, marks: CancelReceipt, sent: Receipt | None) -> RescheduleReceipt:
        return RescheduleReceipt(marks, self.generation, sent)


def delay_until(delay: object, due_at: object, now_ms: int) -> object:
    """The delay a reschedule asks for: ``delay`` as given, or the time from ``now_ms``
    (the publisher's clock, epoch ms) to ``due_at``, a :class:`~datetime.datetime` with
    its time zone (a moment already past: no delay). Exactly one of the two."""
    if (delay is None) == (due_at is None):
        raise InvalidDelay("give exactly one of delay= and due_at=")
    if due_at is None:
        return delay
    if not isinstance(due_at, datetime):
        raise InvalidDelay(f"due_at must be a datetime, not {type(due_at).__name__}")
    if due_at.tzinfo is None or due_at.utcoffset() is None:
        raise InvalidDelay(
            f"due_at {due_at.isoformat()} has no time zone: give it one (timezone.utc, "
            "ZoneInfo(...); Z or +01:00 in ISO 8601) so it means one moment wherever it runs"
        )
    left_ms = round(due_at.timestamp() * 1000) - now_ms
    return timedelta(milliseconds=max(0, left_ms))


def plan_reschedule(
    factory: MessageFactory,
    generations: Generations,
    now_ms: int,
    body: object,
    routing_key: str,
    delay: object,
    *,
    message_id: str | None,
    key: str | None,
    queues: Iterable[str] | None,
    key_scope: KeyScope | str,
    headers: Mapping[str, Any] | None,
    strategy: Strategy | str | None,
    generation: int | None,
    due_at: datetime | None = None,
) -> Rescheduling:
    """Both publishers' ``reschedule`` before the store and the broker: the new copy built
    (the id asked for, or the one derived from the business key; its delay ``delay``, or
    until ``due_at``) and stamped with its generation, and the marks its older copies get
    in every queue it reaches."""
    one_of(message_id, key)
    topology = factory.topology
    message = factory.build(
        body,
        routing_key,
        delay_until(delay, due_at, now_ms),
        message_id=new_copy_id(topology, message_id, key),
        headers=headers,
        strategy=strategy,
    )
    chosen = generations.next(now_ms, generation)
    plan = plan_cancels(
        topology,
        now_ms=now_ms,
        routing_key=message.receipt.routing_key,
        queues=queues,
        key_scope=key_scope,
        generation=chosen,
        **one_of(message_id, key),
    )
    return Rescheduling(stamped(message, chosen), chosen, plan)


def new_copy_id(topology: Topology, message_id: str | None, key: str | None) -> str:
    """The new copy's message id: the one asked for, or the id bulk scheduling derives
    from the business key (consumers keyed by id then meet the same key)."""
    if message_id is not None:
        return message_id
    assert key is not None
    return key_message_id(topology.namespace, key)
