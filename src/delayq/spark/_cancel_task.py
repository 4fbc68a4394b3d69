"""What each Spark task of :func:`delayq.spark.cancel.cancel_from_dataframe` runs on its
executor: the store opened from its URL, rows planned and marked in batches, answers
counted (plain data in, tuples out)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from delayq.errors import InvalidInput
from delayq.message.cancel import plan_cancels
from delayq.stores.base import run_cancels
from delayq.stores.url import open_store
from delayq.topology.model import Topology

__all__ = ["BATCH", "REJECTED", "STATUS", "cancel_partition"]

BATCH = 500
"""Rows per ``cancel_batch`` call (one store round trip)."""

STATUS, REJECTED = "status", "rejected"


def cancel_partition(
    store_url: str,
    topology_data: dict[str, Any],
    *,
    by: str,
    key_scope: str,
    queues: list[str] | None,
    routed: bool = False,
    batch: int = BATCH,
    clock_ms: Callable[[], int] | None = None,
) -> Callable[[Iterable[Any]], Iterator[tuple[Any, ...]]]:
    """The function each Spark task runs over its rows ``(name, routing_key)`` (with
    ``routed``, the input has a routing key column: a row's null routing key is rejected).

    It yields one ``("rejected", message_id, key, routing_key, error, reason, 1)`` per
    rejected row and one ``("status", None, None, None, status, None, n)`` per answer.
    """

    def run(rows: Iterable[Any]) -> Iterator[tuple[Any, ...]]:
        topology = Topology.model_validate(topology_data)
        now = clock_ms or (lambda: int(time.time() * 1000))
        statuses: Counter[str] = Counter()
        how: dict[str, Any] = {"by": by, "key_scope": key_scope, "queues": queues, "routed": routed}
        rejected: list[tuple[Any, ...]] = []
        store = open_store(store_url, what="store_url")
        try:
            chunk: list[tuple[str | None, str | None]] = []
            for name, routing_key in rows:
                chunk.append((name, routing_key))
                if len(chunk) >= batch:
                    rejected += _cancel_chunk(store, topology, chunk, now(), statuses, **how)
                    chunk = []
            if chunk:
                rejected += _cancel_chunk(store, topology, chunk, now(), statuses, **how)
        finally:
            store.close()
        yield from rejected
        for status, count in statuses.items():
            yield (STATUS, None, None, None, status, None, count)

    return run


def _cancel_chunk(
    store: object,
    topology: Topology,
    chunk: list[tuple[str | None, str | None]],
    now_ms: int,
    statuses: Counter[str],
    *,
    by: str,
    key_scope: str,
    queues: list[str] | None,
    routed: bool,
) -> list[tuple[Any, ...]]:
    """One batch of rows, planned per routing key and marked in one store round trip:
    the answers counted into ``statuses``, the rows rejected returned."""
    rejected: list[tuple[Any, ...]] = []

    def reject(name: str | None, routing_key: str | None, error: str, reason: str) -> None:
        ids = (name, None) if by == "message_ids" else (None, name)
        rejected.append((REJECTED, *ids, routing_key, error, reason, 1))

    what = "message id" if by == "message_ids" else "key"
    groups: dict[str | None, list[str]] = {}
    for name, routing_key in chunk:
        if name is None:
            reject(name, routing_key, _bad_name(by), f"the {what} is null")
        elif not name.strip():
            reject(name, routing_key, _bad_name(by), f"the {what} is empty (or blank)")
        elif routed and routing_key is None:
            reason = (
                "the routing key is null: give one, or leave out the routing key column "
                "to mark every destination"
            )
            reject(name, routing_key, "InvalidRoutingKey", reason)
        else:
            groups.setdefault(routing_key, []).append(name)
    plans = []
    for routing_key, names in groups.items():
        try:
            plans.append(
                plan_cancels(
                    topology,
                    now_ms=now_ms,
                    routing_key=routing_key,
                    queues=queues,
                    key_scope=key_scope,
                    message_ids=names if by == "message_ids" else None,
                    keys=None if by == "message_ids" else names,
                )
            )
        except InvalidInput as exc:  # a routing key no destination binds, a bad one
            unbound = "reaches no destination" in str(exc)
            error = "UnboundRoutingKey" if unbound else type(exc).__name__
            for name in names:
                reject(name, routing_key, error, str(exc))
    ops = [op for plan in plans for op in plan.ops]
    if not ops:
        return rejected
    answers = run_cancels(store, ops)
    start = 0
    for plan in plans:
        for receipt in plan.receipts(answers[start : start + len(plan.ops)]):
            statuses[receipt.status.value] += 1
        start += len(plan.ops)
    return rejected


def _bad_name(by: str) -> str:
    return "InvalidMessageId" if by == "message_ids" else "InvalidKey"
