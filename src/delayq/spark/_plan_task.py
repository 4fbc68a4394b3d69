"""What a scheduling task reads (:func:`task_row`) and the task of a dry run
(:func:`plan_partition`): every row planned against the topology, nothing sent."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from delayq.message.bulk import BulkPlanner, Rejection, Row, tier_of
from delayq.topology.model import Topology

__all__ = ["PUBLISHED", "REJECTED", "plan_partition", "rejected_tuple", "task_row"]

PUBLISHED, REJECTED = "published", "rejected"


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


def rejected_tuple(r: Rejection, row_id: str | None) -> tuple[Any, ...]:
    """A rejection as a task's result tuple."""
    return (REJECTED, r.key, r.routing_key, r.delay, r.tier, r.error, r.reason, 1, row_id)


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
            yield (PUBLISHED, None, None, None, tier, None, None, count, None)

    return run
