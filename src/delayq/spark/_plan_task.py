"""What a scheduling task reads (:func:`task_row`) and the task of a dry run
(:func:`plan_partition`): every row planned against the topology, nothing sent."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from delayq.message.bulk import BulkPlanner, Rejection, Row, tier_of
from delayq.topology.model import Topology

__all__ = [
    "LOST",
    "PUBLISHED",
    "REJECTED",
    "SALVAGING",
    "count_tuple",
    "plan_partition",
    "rejected_tuple",
    "salvaging",
    "task_row",
]

PUBLISHED, REJECTED, LOST = "published", "rejected", "lost"

SALVAGING = "delayq.salvaging"
"""The Spark local property set while a failed job's cached results are read back
(:mod:`delayq.spark._salvage`): a publishing task computed then must send nothing, and
yields one ``lost`` line instead of its results."""


def salvaging() -> bool:
    """This Spark task is reading back a failed job's results: it must publish nothing."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return context is not None and bool(context.getLocalProperty(SALVAGING))


def task_row(values: Any) -> tuple[Row, str | None]:
    """One task input row ``(key, routing_key, delay, due_us, due_text, body, id)`` as a
    :class:`~delayq.message.bulk.Row`, and the row's id (``id_col``) for its rejection."""
    key, routing_key, delay, due_us, due_text, body, row_id = values
    row = Row(
        key=key,
        routing_key=routing_key,
        body=body,
        delay=delay,
        due_at_ms=None if due_us is None else -(-int(due_us) // 1000),
        due_text=due_text,
    )
    return row, row_id


def rejected_tuple(r: Rejection, row_id: str | None, kind: str = REJECTED) -> tuple[Any, ...]:
    """A rejection (or, ``kind`` unconfirmed, a row not confirmed) as a task's result
    tuple ``(kind, key, routing_key, delay, tier, error, reason, 1, id)``."""
    return (kind, r.key, r.routing_key, r.delay, r.tier, r.error, r.reason, 1, row_id)


def count_tuple(kind: str, count: int, tier: str | None = None) -> tuple[Any, ...]:
    """A count of a task's (``published`` per tier, ``retried``) as a result tuple."""
    return (kind, None, None, None, tier, None, None, count, None)


def plan_partition(
    topology_data: dict[str, Any], *, body_json: bool
) -> Callable[[Iterable[Any]], Iterator[tuple[Any, ...]]]:
    """A dry run's task: the same result tuples as a publishing task, the messages it
    would publish counted per tier, without a connection."""

    def run(rows: Iterable[Any]) -> Iterator[tuple[Any, ...]]:
        planner = BulkPlanner(Topology.model_validate(topology_data), body_json=body_json)
        would: Counter[str] = Counter()
        for values in rows:
            row, row_id = task_row(values)
            planned = planner.plan(row)
            if isinstance(planned, Rejection):
                yield rejected_tuple(planned, row_id)
            else:
                would[tier_of(planned)] += 1
        for tier, count in would.items():
            yield count_tuple(PUBLISHED, count, tier)

    return run
