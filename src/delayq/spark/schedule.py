"""Bulk scheduling from a DataFrame: every partition publishes through one connection.

Each Spark task plans its rows with :class:`~delayq.message.bulk.BulkPlanner` (pure) and
streams the messages through :meth:`delayq.sync.Publisher.send_many` with
pipelined confirms. Message ids are derived from the key column, so a retried
task, a recomputed partition or a re-run job sends only duplicates, which
idempotent consumers skip.

A partition whose connection drops reconnects and sends again only what was not
confirmed, while the broker has been silent for less than ``retry_for``
(:mod:`delayq.spark._resilient`); rows still unconfirmed then are counted apart,
never as published, written to the errors output, and the job raises
:class:`~delayq.errors.RowsUnconfirmed` with its summary. A task never fails for
the broker, so Spark never re-runs one over an outage. Rows the broker refused
(nacked, unroutable) and rows that cannot be sent are rejections: counted per
tier in the summary and written to the errors output with the reason. More
rejections than ``max_rejected`` (default 0) make the job fail with
:class:`~delayq.errors.RowsRejected` once everything else was published.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from delayq.errors import InvalidInput, RowsRejected
from delayq.message.bulk import RejectionLimit
from delayq.spark._checks import preflight, task_error
from delayq.spark._rejections import rejection_lines, rejections_said
from delayq.spark._resilient import RetryPolicy
from delayq.spark._schedule_task import (
    FAILED,
    PUBLISHED,
    REJECTED,
    RETRIED,
    UNCONFIRMED,
    publish_partition,
)
from delayq.spark._unconfirmed import only_unconfirmed, outage_lines, unconfirmed_error
from delayq.topology.model import Topology
from delayq.urls import resolve_url

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["ERRORS_SCHEMA", "ScheduleSummary", "publish_partition", "schedule"]

ERRORS_SCHEMA = (
    "key string, routing_key string, delay string, tier string, error string, reason string"
)
"""The errors output: one line per row not published (DDL of its Spark schema)."""

Progress = Callable[[int, int], None]
"""Told (tasks done, tasks in all) while the job runs."""


@dataclass(frozen=True)
class ScheduleSummary:
    """What a :func:`schedule` job did: messages published and rows rejected, per tier."""

    published: dict[str, int]
    """Confirmed messages per tier label (``"immediate"`` for no delay)."""
    rejected: dict[str, int]
    """Rejected rows per tier (``"-"``: the row never got a tier)."""
    errors: dict[str, int]
    """Rejected rows per error (``InvalidDelay``, ``DelayTooLong``, ``InvalidBody``...)."""
    errors_path: str | None
    rejections: list[dict[str, Any]] = field(default_factory=list)
    """The rejections themselves when no ``errors_path`` was given."""
    unconfirmed: dict[str, int] = field(default_factory=dict)
    """Rows per tier the broker did not confirm (never counted as published; in the
    errors output with error ``PublishUnconfirmed``, reason ``unconfirmed: ...``)."""
    retried: int = 0
    """Published rows confirmed only after being sent again over a new connection: at
    most this many duplicates at the broker, which idempotent consumers skip."""

    @property
    def total_published(self) -> int:
        return sum(self.published.values())

    @property
    def total_rejected(self) -> int:
        return sum(self.rejected.values())

    @property
    def total_unconfirmed(self) -> int:
        return sum(self.unconfirmed.values())

    @property
    def rows(self) -> int:
        """Rows read: published, rejected and unconfirmed."""
        return self.total_published + self.total_rejected + self.total_unconfirmed

    def render(self) -> str:
        """A small table: published and rejected per tier, then rejections per error."""
        tiers = sorted(set(self.published) | set(self.rejected), key=_tier_order)
        lines = [f"{'tier':>10}  {'published':>10}  {'rejected':>9}"]
        for tier in tiers:
            lines.append(
                f"{tier:>10}  {self.published.get(tier, 0):>10}  {self.rejected.get(tier, 0):>9}"
            )
        lines.append(f"{'total':>10}  {self.total_published:>10}  {self.total_rejected:>9}")
        lines.extend(rejection_lines(self.errors, self.errors_path, self.total_rejected))
        lines.extend(outage_lines(self))
        return "\n".join(lines) + "\n"

    def rejected_error(self, limit: RejectionLimit) -> RowsRejected:
        """The error of a job whose rejections exceed ``limit``: counts, causes, where they are."""
        causes, where = rejections_said(self.errors, self.errors_path)
        return RowsRejected(
            f"{self.total_rejected:,} of {self.rows:,} rows were rejected ({causes}), more "
            f"than max_rejected={limit} allows; {where}. The other {self.total_published:,} "
            "were published: fix the rejected rows and run again (what was published is sent "
            'again as duplicates only), or accept rejections with max_rejected=N or "P%" '
            "(--max-rejected, --allow-rejected)",
            self,
        )


def _tier_order(label: str) -> tuple[int, int]:
    from delayq.durations import to_ms

    if label == "immediate":
        return (0, 0)
    try:
        return (1, to_ms(label))
    except InvalidInput:
        return (2, 0)


def _input_columns(
    df: DataFrame,
    key_col: str,
    routing_key_col: str,
    delay_col: str | None,
    due_col: str | None,
    body_col: str | None,
) -> DataFrame:
    """The six columns a task reads, due times already turned into epoch microseconds."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DateType, StringType, TimestampNTZType, TimestampType

    if (delay_col is None) == (due_col is None):
        raise InvalidInput("give exactly one of delay_col and due_col")
    missing = [
        c
        for c in (key_col, routing_key_col, delay_col, due_col, body_col)
        if c and c not in df.columns
    ]
    if missing:
        raise InvalidInput(
            f"the input has no column {', '.join(map(repr, missing))}; "
            f"its columns: {', '.join(df.columns)}"
        )
    null_str = F.lit(None).cast("string")
    if due_col is not None:
        kind = df.schema[due_col].dataType
        raw = F.col(due_col)
        if isinstance(kind, (TimestampType, TimestampNTZType, DateType)):
            stamp = raw.cast("timestamp")
        elif isinstance(kind, StringType):
            stamp = F.try_to_timestamp(raw)
        else:  # a number has no unit (seconds? ms?): rejected as not a timestamp
            stamp = F.lit(None).cast("timestamp")
        due_us = F.unix_micros(stamp)
        due_text = raw.cast("string")
        delay = F.lit(None)
    else:
        due_us = F.lit(None).cast("long")
        due_text = null_str
        assert delay_col is not None
        delay = F.col(delay_col)
    return df.select(
        F.col(key_col).cast("string").alias("key"),
        F.col(routing_key_col).cast("string").alias("routing_key"),
        delay.alias("delay"),
        due_us.alias("due_us"),
        due_text.alias("due_text"),
        (F.col(body_col) if body_col else F.lit(None)).alias("body"),
    )


def _watch_progress(spark: Any, group: str, progress: Progress, done: threading.Event) -> None:
    tracker = spark.sparkContext.statusTracker()
    last = (-1, -1)
    while True:
        stopping = done.wait(0.5)  # one more poll once the job is done: the final count
        finished = total = 0
        for job_id in tracker.getJobIdsForGroup(group):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job else ():
                stage = tracker.getStageInfo(stage_id)
                if stage is not None:
                    finished += stage.numCompletedTasks
                    total += stage.numTasks
        if total and (finished, total) != last:
            last = (finished, total)
            progress(finished, total)
        if stopping:
            return


def schedule(
    df: DataFrame,
    *,
    url: str | None = None,
    topology: Topology,
    key_col: str = "key",
    routing_key_col: str = "routing_key",
    delay_col: str | None = None,
    due_col: str | None = None,
    body_col: str | None = "body",
    body_json: bool = False,
    errors_path: str | None = None,
    errors_format: str = "json",
    partitions: int | None = None,
    window: int = 1000,
    progress: Progress | None = None,
    max_rejected: int | str | None = 0,
    retry_for: object = "60s",
    backoff: object = "200ms",
    resume_from: str | None = None,
) -> ScheduleSummary:
    """Publish one delayed message per row of ``df``; return what was published and rejected.

    Columns: ``key_col`` (the message id is derived from it), ``routing_key_col``,
    either ``delay_col`` (``"15m"``-style strings or day-time intervals; a bare
    number has no unit and is rejected) or ``due_col`` (timestamps, or ISO 8601
    strings; turned into a delay at publish time, the past meaning immediate),
    and ``body_col`` (str sent as text, binary as bytes, structs, maps, arrays
    and numbers as JSON; with ``body_json`` a str is parsed as JSON).

    Rejected rows go to ``errors_path`` (``errors_format``: json, csv or
    parquet; overwritten, emptied when nothing was rejected) with the reason,
    or into the summary's ``rejections`` when no path is given. More than
    ``max_rejected`` rejections (a row count, ``"P%"`` of the rows read, or
    ``None`` for any number; default 0) raise
    :class:`~delayq.errors.RowsRejected` (its ``summary`` is the job's) after
    the rest was published. Two rows with the same key would be one message id,
    and an idempotent consumer would skip the second: such an input is refused
    before anything is sent. ``partitions`` repartitions the input first (one
    connection per partition). The topology must be applied.

    A partition whose connection drops sends what was not confirmed again on a new
    one, pausing ``backoff`` (doubled each time, up to 5 s) between attempts, for as
    long as the broker confirms nothing for less than ``retry_for`` (durations; a
    confirm resets the clock). Rows still unconfirmed then are neither published nor
    rejected: the summary's ``unconfirmed``, written to the errors output (error
    ``PublishUnconfirmed``, reason ``unconfirmed: ...``), and the job raises
    :class:`~delayq.errors.RowsUnconfirmed` (its ``summary`` the job's) once every
    partition is accounted for. ``resume_from`` (a previous run's errors output, in
    ``errors_format``) keeps only the rows it names as unconfirmed: the same input
    and ``resume_from`` send just what that run left unconfirmed.
    """
    from pyspark import StorageLevel

    url = resolve_url(url)
    limit = RejectionLimit.parse(max_rejected)
    if errors_format not in ("json", "csv", "parquet"):
        raise InvalidInput(f"errors_format must be json, csv or parquet, not {errors_format!r}")
    for name, value in (("window", window), ("partitions", partitions)):
        if value is not None and (isinstance(value, bool) or value < 1):
            raise InvalidInput(f"{name} must be at least 1, got {value!r}")
    policy = RetryPolicy.parse(retry_for, backoff)
    selected = _input_columns(df, key_col, routing_key_col, delay_col, due_col, body_col)
    if resume_from is not None:
        selected = only_unconfirmed(
            selected, resume_from, errors_format, errors_path, ERRORS_SCHEMA
        )
    _refuse_duplicate_keys(selected, key_col)
    preflight(url, topology)
    if partitions is not None:
        selected = selected.repartition(partitions)
    group = f"delayq-schedule-{uuid.uuid4().hex[:8]}"
    task = publish_partition(
        url,
        topology.model_dump(mode="json"),
        window=window,
        body_json=body_json,
        policy=policy,
        job=group,
    )
    spark = df.sparkSession
    results = selected.rdd.mapPartitions(task).persist(StorageLevel.MEMORY_AND_DISK)
    spark.sparkContext.setJobGroup(group, "delayq: scheduling messages")
    done = threading.Event()
    watcher = None
    if progress is not None:
        watcher = threading.Thread(
            target=_watch_progress, args=(spark, group, progress, done), daemon=True
        )
        watcher.start()
    try:
        # The one action that publishes; the persisted results feed what follows.
        # Were a cached partition lost, recomputing it re-sends its rows:
        # duplicates only, by the key-derived ids.
        results.count()
    except Exception as exc:
        results.unpersist()
        error = task_error(exc)
        if error is None:
            raise
        raise error from exc
    finally:
        done.set()
        if watcher is not None:
            watcher.join()
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    try:
        counts = (
            results.map(lambda r: ((r[0], r[4], r[5]), r[7]))
            .reduceByKey(lambda a, b: a + b)
            .collect()
        )
        published: Counter[str] = Counter()
        rejected: Counter[str] = Counter()
        errors: Counter[str] = Counter()
        unconfirmed: Counter[str] = Counter()
        retried = 0
        for (kind, tier, error), count in counts:
            if kind == PUBLISHED:
                published[tier] += count
            elif kind == REJECTED:
                rejected[tier] += count
                errors[error] += count
            elif kind == UNCONFIRMED:
                unconfirmed[tier] += count
            elif kind == RETRIED:
                retried += count
        failures = results.filter(lambda r: r[0] == FAILED).map(lambda r: r[5:7]).collect()
        rejections: list[dict[str, Any]] = []
        rows = results.filter(lambda r: r[0] in (REJECTED, UNCONFIRMED)).map(
            lambda r: tuple(r[1:7])
        )
        if errors_path is not None:
            # Written even when empty: rejections of an earlier run left there would
            # pass for this run's.
            out = spark.createDataFrame(rows, ERRORS_SCHEMA).coalesce(1)
            writer = out.write.mode("overwrite")
            if errors_format == "csv":
                writer = writer.option("header", "true")
            writer.format(errors_format).save(errors_path)
        elif rejected or unconfirmed:
            names = [c.split()[0] for c in ERRORS_SCHEMA.split(", ")]
            rejections = [dict(zip(names, row, strict=True)) for row in rows.collect()]
    finally:
        results.unpersist()
    summary = ScheduleSummary(
        published=dict(published),
        rejected=dict(rejected),
        errors=dict(errors),
        errors_path=errors_path,
        rejections=rejections,
        unconfirmed=dict(unconfirmed),
        retried=retried,
    )
    if unconfirmed or failures:
        raise unconfirmed_error(summary, failures, policy)
    if limit.exceeded(rejected=summary.total_rejected, rows=summary.rows):
        raise summary.rejected_error(limit)
    return summary


def _refuse_duplicate_keys(selected: DataFrame, key_col: str) -> None:
    """Raise :class:`~delayq.errors.InvalidInput` when a key is on several rows (nothing sent)."""
    from pyspark.sql import functions as F

    repeated = (
        selected.where(F.col("key").isNotNull())
        .groupBy("key")
        .count()
        .where(F.col("count") > 1)
        .cache()
    )
    try:
        sample = repeated.limit(3).collect()
        if not sample:
            return
        shown = ", ".join(f"{row['key']!r} ({row['count']} rows)" for row in sample)
        raise InvalidInput(
            f"{repeated.count():,} keys of column {key_col!r} are on more than one row "
            f"(e.g. {shown}): a key is the message id, so an idempotent consumer would "
            "handle the first of them and skip the others as duplicates. Nothing was sent. "
            "Make the key unique (e.g. the key and the due time together), or drop "
            "repeated rows (DataFrame.dropDuplicates) if they are the same message."
        )
    finally:
        repeated.unpersist()
