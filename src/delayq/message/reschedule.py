"""Rescheduling many messages at once, the pure part shared by both publishers.

``reschedule_many`` plans every item with :func:`~delayq.message.cancel.plan_reschedule`
(each new copy built and checked, so bad input anywhere marks nothing), runs all the
marks in one store batch, and publishes the copies whose mark took, in one pipelined
batch. :class:`RescheduleBatch` splits the store's answers back per item and builds the
receipts, in input order.

>>> from delayq import Topology
>>> from delayq.message.factory import MessageFactory
>>> from delayq.message.cancel import Generations
>>> topology = Topology(namespace="shop", ladder=["1m", "1h"],
...     destinations=[{"queue": "billing", "bindings": ["order.*"]}])
>>> batch = plan_reschedules(MessageFactory(topology), Generations(), 1_000,
...     [Reschedule("a", "order.remind", "30m", message_id="m-1"),
...      Reschedule("b", "order.remind", "5m", key="order-2")])
>>> [op.key for op in batch.ops][:2]  # a business key also marks the id derived from it
['q:billing:m-1', 'q:billing:order-2']
>>> len(batch.ops), batch.items[1].message.receipt.delay_ms
(3, 300000)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from delayq.errors import InvalidInput, PublishBatchError
from delayq.message.cancel import (
    CancelReceipt,
    Generations,
    RescheduleReceipt,
    Rescheduling,
    plan_reschedule,
)
from delayq.message.envelope import OutgoingMessage, Receipt
from delayq.stores.base import Cancel, CancelStatus
from delayq.stores.key_scope import KeyScope

if TYPE_CHECKING:
    from delayq.message.factory import MessageFactory
    from delayq.topology.model import Strategy

__all__ = ["Reschedule", "RescheduleBatch", "plan_reschedules"]


@dataclass(frozen=True)
class Reschedule:
    """One item of a ``reschedule_many`` batch; fields as for ``reschedule``: the body
    and routing key again, the new ``delay`` from now, and exactly one of ``message_id``
    or business ``key``."""

    body: object
    routing_key: str
    delay: object = None
    """From now (``"90s"``, a ``timedelta``); or give ``due_at``."""
    message_id: str | None = None
    key: str | None = None
    queues: Iterable[str] | None = None
    """Queues bound outside the topology file that the message also reaches."""
    headers: Mapping[str, Any] | None = None
    strategy: Strategy | str | None = None
    generation: int | None = None
    """``None``: the publisher's clock in ms, kept increasing."""
    due_at: datetime | None = None
    """The new due time, with its time zone (instead of ``delay``)."""


@dataclass(frozen=True)
class RescheduleBatch:
    """Many reschedules planned, before any I/O: their marks as one store batch."""

    items: list[Rescheduling]

    @property
    def ops(self) -> list[Cancel]:
        """Every item's marks, in item order: one store round trip for all."""
        return [op for item in self.items for op in item.plan.ops]

    def marks(self, answers: Sequence[CancelStatus]) -> list[tuple[CancelReceipt, bool]]:
        """Per item: the store's answers to its marks, and whether its copy may be sent."""
        ops = self.ops
        if len(answers) != len(ops):
            raise InvalidInput(f"{len(answers)} answers for {len(ops)} cancel operations")
        found, start = [], 0
        for item in self.items:
            end = start + len(item.plan.ops)
            found.append(item.marks(answers[start:end]))
            start = end
        return found

    @staticmethod
    def publishable(marks: Sequence[tuple[CancelReceipt, bool]]) -> list[int]:
        """The items (indices) whose new copy is to be published."""
        return [index for index, (_, send) in enumerate(marks) if send]

    def messages(self, indices: Sequence[int]) -> list[OutgoingMessage]:
        """The new copies of ``indices``, to publish as one batch."""
        return [self.items[index].message for index in indices]

    def receipts(
        self,
        marks: Sequence[tuple[CancelReceipt, bool]],
        sent: Mapping[int, Receipt],
    ) -> list[RescheduleReceipt]:
        """One receipt per item, in input order; ``sent``: each published item's receipt."""
        return [
            item.receipt(mark, sent.get(index))
            for index, (item, (mark, _)) in enumerate(zip(self.items, marks, strict=True))
        ]

    def failed(
        self,
        marks: Sequence[tuple[CancelReceipt, bool]],
        indices: Sequence[int],
        error: PublishBatchError,
    ) -> PublishBatchError:
        """``error`` (raised for the batch of ``indices``' copies) told per item: the
        receipts of the items that went through (their copies confirmed, or nothing to
        publish), ``None`` and their own error for those whose copy was not confirmed
        (their older copies stay cancelled: reschedule them again)."""
        failures = {indices[at]: failure for at, failure in error.failures.items()}
        sent = {
            index: receipt
            for at, (index, receipt) in enumerate(zip(indices, error.receipts, strict=True))
            if at not in error.failures and receipt is not None
        }
        receipts: list[Any] = [
            None if index in failures else receipt
            for index, receipt in enumerate(self.receipts(marks, sent))
        ]
        return PublishBatchError(receipts, failures)


def _identity(item: Reschedule) -> tuple[str, str]:
    return ("key", item.key) if item.key is not None else ("message_id", str(item.message_id))


def plan_reschedules(
    factory: MessageFactory,
    generations: Generations,
    now_ms: int,
    items: Iterable[Reschedule],
    *,
    key_scope: KeyScope | str = KeyScope.QUEUE,
) -> RescheduleBatch:
    """Both publishers' ``reschedule_many`` before the store and the broker: every item
    planned as :func:`~delayq.message.cancel.plan_reschedule` does, each checked (an
    :class:`~delayq.errors.InvalidInput` naming the item, before anything is marked). A
    message named twice is refused: its two copies would race each other."""
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Iterable):
        raise InvalidInput(f"reschedule_many takes a list of delayq.Reschedule, not {items!r}")
    planned: list[Rescheduling] = []
    seen: dict[tuple[str, str], int] = {}
    for index, item in enumerate(items):
        if not isinstance(item, Reschedule):
            raise InvalidInput(
                f"reschedule_many takes delayq.Reschedule items; item {index} is "
                f"{type(item).__name__}"
            )
        try:
            planned.append(
                plan_reschedule(
                    factory,
                    generations,
                    now_ms,
                    item.body,
                    item.routing_key,
                    item.delay,
                    message_id=item.message_id,
                    key=item.key,
                    queues=item.queues,
                    key_scope=key_scope,
                    headers=item.headers,
                    strategy=item.strategy,
                    due_at=item.due_at,
                    generation=item.generation,
                )
            )
        except InvalidInput as exc:
            raise type(exc)(f"item {index}: {exc}") from exc
        identity = _identity(item)
        if identity in seen:
            raise InvalidInput(
                f"item {index}: {identity[0]} {identity[1]!r} is item {seen[identity]} too "
                "(reschedule a message once per batch)"
            )
        seen[identity] = index
    return RescheduleBatch(planned)
