"""The bridge's window: the deliveries it published and has not yet settled, in delivery
order, and the acks and nacks that settle them (pure: no I/O, no thread).

A delivery is acked only once the broker confirmed where it went, and never past one
still in flight: :meth:`Window.ready` gives the settled ones at the front, in delivery
order, and :func:`coalesce` turns them into one ``multiple`` ack per run of confirmed
ones and a nack for each one the broker refused.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from delayq.intake.relay import Forward, Park

__all__ = ["Plan", "Settled", "Window", "coalesce"]


Plan = Forward | Park


class Window:
    """The deliveries sent but not yet settled, in delivery order: each waits for its
    outcome, and for every one before it."""

    def __init__(self) -> None:
        self._pending: OrderedDict[int, Plan] = OrderedDict()
        self._outcomes: dict[int, BaseException | None] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, tag: int, plan: Plan) -> None:
        self._pending[tag] = plan

    def plan(self, tag: int) -> Plan:
        return self._pending[tag]

    def discard(self, tag: int) -> None:
        """Leave ``tag`` out (rejected: settled on the channel already)."""
        self._pending.pop(tag, None)
        self._outcomes.pop(tag, None)

    def settled(self, tag: int, error: BaseException | None) -> None:
        """``tag``'s outcome (``None``: confirmed); only the first one counts."""
        if tag in self._pending:
            self._outcomes.setdefault(tag, error)

    def ready(self) -> list[Settled]:
        """The settled deliveries at the front, in delivery order, taken out."""
        done: list[Settled] = []
        pending, outcomes = self._pending, self._outcomes
        while pending:
            tag = next(iter(pending))
            if tag not in outcomes:
                break
            done.append(Settled(tag, pending.pop(tag), outcomes.pop(tag)))
        return done


@dataclass(frozen=True, slots=True)
class Settled:
    """A delivery whose forward (or park) the broker confirmed (``error`` ``None``) or
    did not take."""

    tag: int
    plan: Plan
    error: BaseException | None


def coalesce(done: list[Settled]) -> list[tuple[str, int]]:
    """The acks and nacks settling ``done`` (in delivery order): ``("ack", tag)`` acks
    every delivery up to ``tag`` (``multiple``), one per run of confirmed ones;
    ``("nack", tag)`` puts one back on the queue.

    >>> coalesce([Settled(1, p, None), Settled(2, p, None), Settled(3, p, err)])  # doctest: +SKIP
    [('ack', 2), ('nack', 3)]
    """
    steps: list[tuple[str, int]] = []
    last: int | None = None
    for item in done:
        if item.error is None:
            last = item.tag
            continue
        if last is not None:
            steps.append(("ack", last))
            last = None
        steps.append(("nack", item.tag))
    if last is not None:
        steps.append(("ack", last))
    return steps
