"""What each Spark task of a scheduling job runs: plan its rows, publish them through
outages (:mod:`delayq.spark._resilient`), and account for every row.

A task never fails for the broker: a row is published (confirmed), rejected (bad
input, nacked, unroutable) or unconfirmed (the broker stayed silent past the
job's ``retry_for``, or refused for good mid-job), and the task says so in its
output, which the driver turns into the summary and the errors output. Spark
therefore never retries a task over a broker outage. A task Spark runs again for
another reason (a lost executor, a failing UDF upstream) sends its whole partition
again under the same key-derived ids, and counts what it published as ``rerun``:
at most that many duplicates, which idempotent consumers skip.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing, nullcontext
from typing import Any

from delayq.durations import format_ms
from delayq.errors import DelayqError, PublishError, PublishUnconfirmed, StoreError
from delayq.message.bulk import BulkPlanner, Rejection, tier_of
from delayq.message.envelope import OutgoingMessage
from delayq.schedule.base import ScheduleStore
from delayq.schedule.record import ScheduleIndex
from delayq.spark._done_parts import SKIPPED, PartDigest, done_tuple
from delayq.spark._plan_task import (
    LOST,
    PUBLISHED,
    REJECTED,
    count_tuple,
    rejected_tuple,
    salvaging,
    task_row,
)
from delayq.spark._resilient import Outcome, RetryPolicy, Stalled, send_resilient
from delayq.spark._tracing import UNTRACED, TaskTracing
from delayq.topology.model import Topology

__all__ = [
    "FAILED",
    "PUBLISHED",
    "REJECTED",
    "RERUN",
    "RETRIED",
    "UNCONFIRMED",
    "UNCONFIRMED_ERROR",
    "publish_partition",
]

UNCONFIRMED, RETRIED, RERUN, FAILED = "unconfirmed", "retried", "rerun", "failed"
UNCONFIRMED_ERROR = PublishUnconfirmed.__name__
"""The ``error`` of an unconfirmed row in the errors output (its reason: ``unconfirmed: ...``)."""

Tag = tuple[str, str | None]
"""What a message of the stream carries for its row: the key and the row's id (``id_col``)."""

_GAVE_UP: set[str] = set()
"""Jobs a task of this Python worker gave up on: the next tasks of the job try once,
instead of each waiting ``retry_for`` for a broker that is gone."""


def unconfirmed_reason(stalled: Stalled[Any], policy: RetryPolicy) -> str:
    cause = stalled.cause
    if isinstance(cause, StoreError):  # the schedule index's failure: this row never went
        return f"unconfirmed: not sent, the schedule index failed: {type(cause).__name__}: {cause}"
    if stalled.fatal:
        return f"unconfirmed: {type(cause).__name__}: {cause}"
    return (
        f"unconfirmed: the broker confirmed nothing for {format_ms(policy.retry_for_ms)} "
        f"(retry_for; {type(cause).__name__})"
    )


def publish_partition(
    url: str,
    topology_data: dict[str, Any],
    *,
    window: int,
    body_json: bool,
    policy: RetryPolicy,
    job: str,
    tracing: TaskTracing | None = None,
    tracked: bool = False,
    skip: frozenset[str] = frozenset(),
    schedule_index: str | None = None,
) -> Callable[[Iterable[Any]], Iterator[tuple[Any, ...]]]:
    """The function each Spark task runs over its rows (plain data in, tuples out).

    Rows are ``(key, routing_key, delay, due_at_us, due_text, body, id)``
    (:func:`~delayq.spark._plan_task.task_row`). It yields ``(kind, key,
    routing_key, delay, tier, error, reason, n, id)``: one per rejected or
    unconfirmed row (``n`` 1, ``id`` the row's), one ``published`` count per tier
    and one ``retried`` count, and one ``failed`` line (``error``, ``reason``) when
    the broker stayed silent or refused for good. With ``tracing``, each message gets a
    ``publish`` span, a child of the job's (an ``untraced`` line, ``error`` why, when
    this worker's provider factory failed: :mod:`delayq.spark._tracing`).

    ``tracked``: a partition whose every row was confirmed ends with a ``done`` line, its
    rows' digest; with ``skip`` (a killed run's digests) a partition whose digest is
    among them sends nothing and yields ``skipped`` and ``done`` lines
    (:mod:`delayq.spark._done_parts`).

    ``schedule_index`` (a URL): each message is recorded there, a ``window`` at a time
    (:func:`~delayq.schedule.record.recorded_stream`); an index that cannot be written
    fails the partition's rest as unconfirmed, nothing of it sent.
    """

    def run(rows: Iterable[Any]) -> Iterator[tuple[Any, ...]]:
        from delayq.sync.publisher import Publisher

        if salvaging():  # a failed job's lost cached results: never publish them again
            yield count_tuple(LOST, 0)
            return
        digest = PartDigest()
        if skip:  # held to know the digest before anything is sent
            held = list(rows)
            for values in held:
                digest.add(values)
            if digest.value in skip:
                yield count_tuple(SKIPPED, digest.rows)
                if tracked:
                    yield done_tuple(digest)
                return
            rows = iter(held)
        elif tracked:
            rows = digest.reading(rows)
        topology = Topology.model_validate(topology_data)
        rejections: list[tuple[Rejection, str | None]] = []
        published: Counter[str] = Counter()
        provider, untraced = (None, None) if tracing is None else tracing.provider()
        try:
            index, unopened = _index(schedule_index), None
        except DelayqError as exc:  # this task cannot open it: its rows unconfirmed, unsent
            index, unopened = None, exc
        with (
            nullcontext() if index is None else closing(index),
            Publisher(
                url,
                topology,
                publish_attempts=1,  # the waiting is send_resilient's
                connect_attempts=1,
                reconnect_within=None,  # and the budget: send_resilient's retry_for
                retry_backoff_s=policy.backoff_ms / 1000,
                tracing=provider,  # None: as without tracing= (a worker's global provider, if set)
                schedule=None if index is None else ScheduleIndex(index),
            ) as publisher,
        ):
            planner = BulkPlanner(topology, factory=publisher.factory, body_json=body_json)

            def stream() -> Iterator[tuple[Tag, OutgoingMessage]]:
                for values in rows:
                    row, row_id = task_row(values)
                    planned = planner.plan(row)
                    if isinstance(planned, Rejection):
                        rejections.append((planned, row_id))
                    else:
                        yield (str(row.key), row_id), planned

            def settle(tag: Tag, msg: OutgoingMessage, error: PublishError | None) -> None:
                if error is None:
                    published[tier_of(msg)] += 1
                else:  # nacked or unroutable: unconfirmed ones are send_resilient's
                    key, row_id = tag
                    rejections.append((planner.rejected(msg, error, key), row_id))

            rest = stream()
            if unopened is not None:
                outcome: Outcome[Tag] = Outcome(stalled=Stalled(unopened, [], True))
            else:
                with tracing.sending(provider) if tracing is not None else nullcontext():
                    outcome = send_resilient(
                        publisher,
                        rest,
                        settle,
                        window=window,
                        policy=policy,
                        give_up_at_once=job in _GAVE_UP,
                    )
            stalled = outcome.stalled
            if stalled is None:
                _GAVE_UP.discard(job)
            elif not stalled.fatal:
                _GAVE_UP.add(job)
        if stalled is not None:
            said = PublishUnconfirmed(unconfirmed_reason(stalled, policy))
            # What was left unconfirmed, then the rest, planned (a bad row is still a
            # rejection) and not sent: streamed out, never all held at once.
            for (key, row_id), msg in itertools.chain(stalled.left, rest):
                yield rejected_tuple(planner.rejected(msg, said, key), row_id, UNCONFIRMED)
            yield (FAILED, None, None, None, None, type(stalled.cause).__name__, str(said), 1, None)
        for r, row_id in rejections:
            yield rejected_tuple(r, row_id)
        for tier, count in published.items():
            yield count_tuple(PUBLISHED, count, tier)
        if outcome.retried:
            yield count_tuple(RETRIED, outcome.retried)
        if published and _attempt() > 0:  # an earlier attempt may have sent them too
            yield count_tuple(RERUN, sum(published.values()))
        if tracked and stalled is None and not rejections and digest.rows:
            yield done_tuple(digest)  # every row read (the stream ran out) and confirmed
        if untraced is not None:
            yield (UNTRACED, None, None, None, None, untraced, None, 1, None)

    return run


def _index(url: str | None) -> ScheduleStore | None:
    if url is None:
        return None
    from delayq.schedule.url import open_index

    return open_index(url, create=True, what="schedule_index")


def _attempt() -> int:
    """Which attempt of its task this is (0: the first), as Spark numbers them."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.attemptNumber() if context is not None else 0
