"""Bulk cancellation from a DataFrame of message ids or business keys.

Each Spark task opens the consumers' idempotency store from its URL (a store cannot be
sent to an executor; a URL can), plans its rows' marks with
:func:`delayq.message.cancel.plan_cancels` (what ``Publisher.cancel_many`` does) in
batches of :data:`BATCH` rows, one ``cancel_batch`` round trip each, and counts the
answers. No broker is involved: a cancel is a mark in the store (see
``docs/concepts/cancel.md``).

Cancelling by business key marks, in each queue, the key and the message id bulk
scheduling derives from it (:func:`~delayq.message.bulk.key_message_id`), so messages
of :func:`delayq.spark.schedule` are cancelled by the very column they were scheduled
from. Rows without an id (null, empty) or with a routing key that reaches no queue are
rejected with the reason. A store failure fails the task (Spark retries it; marks are
idempotent: a cancelled message answers ``already cancelled`` the second time).
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from delayq.errors import InvalidInput, RowsRejected, SparkJobFailed
from delayq.message.bulk import RejectionLimit
from delayq.message.cancel import plan_cancels
from delayq.spark._cancel_task import BATCH, REJECTED, STATUS, cancel_partition
from delayq.spark._checks import task_error
from delayq.spark._failure import cause_line
from delayq.spark._progress import watch_tasks
from delayq.spark._rejections import rejection_lines, rejections_said
from delayq.spark.schedule import Progress
from delayq.stores.base import CancelStatus
from delayq.stores.key_scope import KeyScope
from delayq.stores.url import absolute_store_url, open_store
from delayq.topology.model import Topology

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "BATCH",
    "CANCEL_ERRORS_SCHEMA",
    "CancelSummary",
    "cancel_from_dataframe",
    "check_store_url",
]

CANCEL_ERRORS_SCHEMA = (
    "message_id string, key string, routing_key string, error string, reason string"
)
"""The errors output: one line per row not cancelled for its input (DDL of its schema)."""

STATUSES = tuple(status.value for status in CancelStatus)
NOT_CANCELLED = (
    CancelStatus.IN_PROGRESS.value,
    CancelStatus.ALREADY_HANDLED.value,
    CancelStatus.OUTDATED.value,
)
"""Answers of messages the job did not stop: a handler ran or runs (a lost race)."""

_WHOLE = ("byte", "short", "int", "long", "integer", "bigint", "smallint", "tinyint")


@dataclass(frozen=True)
class CancelSummary:
    """What a :func:`cancel_from_dataframe` job did: one answer per row, counted."""

    by: str
    """``"message_ids"`` or ``"keys"``: what the rows name."""
    statuses: dict[str, int]
    """Rows per answer (:class:`~delayq.stores.base.CancelStatus` values), summed over
    the queues as a receipt's ``status`` is: ``already handled`` or ``in progress`` if so
    in any queue."""
    rejected: int
    errors: dict[str, int]
    """Rejected rows per error (``InvalidMessageId``, ``UnboundRoutingKey``...)."""
    errors_path: str | None
    rejections: list[dict[str, Any]] = field(default_factory=list)
    """The rejections themselves when no ``errors_path`` was given."""

    @property
    def cancelled(self) -> int:
        """Rows whose message will not be handled: ``cancelled``, ``unknown`` (marked
        before any delivery) or ``already cancelled``."""
        return sum(n for s, n in self.statuses.items() if s not in NOT_CANCELLED)

    @property
    def not_cancelled(self) -> int:
        """Rows that lost the race with a handler (``in progress``, ``already handled``)
        or met a newer reschedule (``outdated``): their messages were NOT cancelled."""
        return sum(self.statuses.get(s, 0) for s in NOT_CANCELLED)

    @property
    def rows(self) -> int:
        """Rows read: answered plus rejected."""
        return sum(self.statuses.values()) + self.rejected

    def to_json(self) -> dict[str, Any]:
        return {
            "by": self.by,
            "rows": self.rows,
            "cancelled": self.cancelled,
            "not_cancelled": self.not_cancelled,
            "statuses": {s: self.statuses.get(s, 0) for s in STATUSES},
            "rejected": self.rejected,
            "errors": dict(self.errors),
            "errors_path": self.errors_path,
            "rejections": self.rejections,
        }

    def render(self) -> str:
        """A small table of rows per answer, then what was not cancelled and rejected."""
        lines = [f"{'status':>17}  {'rows':>9}"]
        for status in STATUSES:
            lines.append(f"{status:>17}  {self.statuses.get(status, 0):>9}")
        lines.append(f"{'rejected':>17}  {self.rejected:>9}")
        lines.append(f"{'total':>17}  {self.rows:>9}")
        lines.append(
            f"cancelled: {self.cancelled} (cancelled, unknown: marked before any delivery, "
            "already cancelled)"
        )
        if self.not_cancelled:
            lines.append(
                f"NOT cancelled: {self.not_cancelled} (in progress: a handler is running; "
                "already handled: done; outdated: a newer reschedule): those messages are "
                "handled"
            )
        lines.extend(rejection_lines(self.errors, self.errors_path, self.rejected))
        return "\n".join(lines) + "\n"

    def rejected_error(self, limit: RejectionLimit) -> RowsRejected:
        causes, where = rejections_said(self.errors, self.errors_path)
        return RowsRejected(
            f"{self.rejected:,} of {self.rows:,} rows were rejected ({causes}), more than "
            f"max_rejected={limit} allows; {where}. The other rows were answered (see the "
            "summary): fix the rejected rows and run again (a cancelled message then "
            "answers 'already cancelled')",
            self,
        )


def check_store_url(store_url: object, *, what: str = "store_url") -> str:
    """The URL the executors open, checked on the driver: not a store object, not a
    store in one process's memory; a relative SQLite path made absolute."""
    if not isinstance(store_url, str):
        raise InvalidInput(
            f"{what} must be the store's URL (str), not {type(store_url).__name__}: a "
            "store cannot be sent to Spark's executors, each opens its own from the URL"
        )
    text = store_url.strip()
    lowered = text.lower()
    if lowered.startswith("memory:") or ":memory:" in lowered or lowered == "memory":
        raise InvalidInput(
            f"{what} {text!r} is a store in one process's memory: Spark's executors are "
            "other processes, and the consumers would never see their marks. Give the "
            "consumers' own store: sqlite:///path.db (executors on this machine), "
            "redis://... or postgresql://..."
        )
    return absolute_store_url(text, what=what)


def _input_columns(
    df: DataFrame, id_column: str | None, key_column: str | None, routing_key_column: str | None
) -> tuple[str, DataFrame]:
    """What the rows name, and the two columns a task reads, as text."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    if (id_column is None) == (key_column is None):
        raise InvalidInput(
            "give exactly one of id_column (message ids) and key_column (business keys, "
            "or the key column of a bulk scheduling)"
        )
    column = id_column if id_column is not None else key_column
    assert column is not None
    missing = [c for c in (column, routing_key_column) if c and c not in df.columns]
    if missing:
        raise InvalidInput(
            f"the input has no column {', '.join(map(repr, missing))}; "
            f"its columns: {', '.join(df.columns)}"
        )
    kind = df.schema[column].dataType
    if not isinstance(kind, StringType) and kind.simpleString() not in _WHOLE:
        raise InvalidInput(
            f"column {column!r} is {kind.simpleString()}: message ids and keys are text or "
            "whole numbers (cast it, as the scheduling job read it)"
        )
    routing = F.col(routing_key_column).cast("string") if routing_key_column else F.lit(None)
    by = "message_ids" if id_column is not None else "keys"
    # The scheduling job casts its key column to string: the same text, the same id.
    return by, df.select(
        F.col(column).cast("string").alias("name"), routing.cast("string").alias("routing_key")
    )


def cancel_from_dataframe(
    df: DataFrame,
    topology: Topology,
    store_url: str,
    *,
    id_column: str | None = None,
    key_column: str | None = None,
    routing_key_column: str | None = None,
    key_scope: KeyScope | str = KeyScope.QUEUE,
    queues: Iterable[str] | None = None,
    errors_path: str | None = None,
    errors_format: str = "json",
    partitions: int | None = None,
    progress: Progress | None = None,
    max_rejected: int | str | None = 0,
) -> CancelSummary:
    """Cancel the message of every row of ``df``; return the answers counted.

    Rows name messages by ``id_column`` (consumers keyed by message id) or
    ``key_column`` (business keys: consumers with ``key=``, and messages of
    :func:`delayq.spark.schedule`, cancelled by its key column). ``routing_key_column``
    marks only the queues each row's routing key reaches (default: every destination
    of ``topology``, plus ``queues``); ``key_scope`` is the consumers'. ``store_url``
    is the consumers' store: ``sqlite:///path.db`` (executors on one machine),
    ``redis://...`` or ``postgresql://...``; it is opened on the driver first, so a
    store that cannot be reached fails before any task.

    Rejected rows (null or empty id, a routing key that reaches no queue) go to
    ``errors_path`` (``errors_format``: json, csv or parquet; overwritten) with the
    reason, or into the summary's ``rejections``. More than ``max_rejected`` of them
    (a count, ``"P%"``, ``None`` for any; default 0) raise
    :class:`~delayq.errors.RowsRejected` (its ``summary`` is the job's) once the other
    rows are answered. Rows answered ``in progress`` or ``already handled`` are not
    errors, but their messages were not cancelled: see :attr:`CancelSummary.not_cancelled`.
    """
    from pyspark import StorageLevel

    limit = RejectionLimit.parse(max_rejected)
    if errors_format not in ("json", "csv", "parquet"):
        raise InvalidInput(f"errors_format must be json, csv or parquet, not {errors_format!r}")
    if partitions is not None and (isinstance(partitions, bool) or partitions < 1):
        raise InvalidInput(f"partitions must be at least 1, got {partitions!r}")
    scope = KeyScope.parse(key_scope)
    named = None if queues is None else list(queues)
    by, selected = _input_columns(df, id_column, key_column, routing_key_column)
    url = check_store_url(store_url)
    plan_cancels(topology, now_ms=0, message_ids=[], queues=named, key_scope=scope)
    open_store(url, what="store_url").close()  # reached from the driver first
    if partitions is not None:
        selected = selected.repartition(partitions)
    task = cancel_partition(
        url,
        topology.model_dump(mode="json"),
        by=by,
        key_scope=scope.value,
        queues=named,
        routed=routing_key_column is not None,
    )
    spark = df.sparkSession
    results = selected.rdd.mapPartitions(task).persist(StorageLevel.MEMORY_AND_DISK)
    group = f"delayq-cancel-{uuid.uuid4().hex[:8]}"
    spark.sparkContext.setJobGroup(group, "delayq: cancelling messages")
    done = threading.Event()
    watcher = None
    if progress is not None:
        watcher = threading.Thread(
            target=watch_tasks, args=(spark, group, progress, done), daemon=True
        )
        watcher.start()
    try:
        results.count()  # the one action that marks; the persisted results feed the rest
    except Exception as exc:
        results.unpersist()
        error = task_error(
            exc,
            note=" (raised in a Spark task; the marks made before it stay: run the job "
            "again, a message cancelled then answers 'already cancelled')",
        )
        if error is None:  # Spark's own failure: one line, not pages of stack
            raise SparkJobFailed(
                f"the Spark job failed: {cause_line(exc)}. The marks made before it stay: "
                "fix the cause and run the job again (a message cancelled then answers "
                "'already cancelled')"
            ) from exc
        raise error from exc
    finally:
        done.set()
        if watcher is not None:
            watcher.join()
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    try:
        summary = _collect(spark, results, by, errors_path, errors_format)
    finally:
        results.unpersist()
    if limit.exceeded(rejected=summary.rejected, rows=summary.rows):
        raise summary.rejected_error(limit)
    return summary


def _collect(
    spark: Any, results: Any, by: str, errors_path: str | None, errors_format: str
) -> CancelSummary:
    counts = results.map(lambda r: ((r[0], r[4]), r[6])).reduceByKey(lambda a, b: a + b).collect()
    statuses: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    for (kind, name), count in counts:
        (statuses if kind == STATUS else errors)[name] += count
    rows = results.filter(lambda r: r[0] == REJECTED).map(lambda r: tuple(r[1:6]))
    rejections: list[dict[str, Any]] = []
    if errors_path is not None:
        # Written even when empty: rejections of an earlier run must not pass for this one's.
        writer = spark.createDataFrame(rows, CANCEL_ERRORS_SCHEMA).coalesce(1).write
        writer = writer.mode("overwrite")
        if errors_format == "csv":
            writer = writer.option("header", "true")
        writer.format(errors_format).save(errors_path)
    elif errors:
        names = [c.split()[0] for c in CANCEL_ERRORS_SCHEMA.split(", ")]
        rejections = [dict(zip(names, row, strict=True)) for row in rows.collect()]
    return CancelSummary(
        by=by,
        statuses=dict(statuses),
        rejected=sum(errors.values()),
        errors=dict(errors),
        errors_path=errors_path,
        rejections=rejections,
    )
