"""Bulk scheduling from a DataFrame: every partition publishes through one connection.

Each Spark task plans its rows with :class:`~delayq.message.bulk.BulkPlanner` (pure) and
streams the messages through :meth:`delayq.sync.Publisher.send_many` with
pipelined confirms. Message ids are derived from the key column, so a retried
task, a recomputed partition or a re-run job sends only duplicates, which
idempotent consumers skip.

A task whose messages the broker did not confirm (connection lost for good,
publishers blocked) fails, and Spark retries it. Rows the broker refused
(nacked, unroutable) and rows that cannot be sent are rejections: counted per
tier in the summary and written to the errors output with the reason. More
rejections than ``max_rejected`` (default 0) make the job fail with
:class:`~delayq.errors.RowsRejected` once everything else was published.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from delayq.errors import InvalidInput, PublishError, PublishRejected, RowsRejected, Unroutable
from delayq.message.bulk import BulkPlanner, Rejection, RejectionLimit, tier_of
from delayq.message.envelope import OutgoingMessage
from delayq.spark._checks import preflight, task_error
from delayq.spark._inputs import input_columns, prepare
from delayq.spark._plan_task import plan_partition, rejected_tuple, task_row
from delayq.spark._progress import RowCounter, counting
from delayq.spark._rejections import rejection_lines, rejections_said
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
"""Told (done, in all) while the job runs: Spark tasks (cancel), rows read (schedule)."""

_PUBLISHED, _REJECTED = "published", "rejected"


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
    duplicate_in_input: int = 0
    """Rows whose key is on another row of the input too (rejected, or left out by
    ``duplicates="keep-last"``)."""
    dry_run: bool = False
    """Nothing was published: ``published`` counts what would have been."""

    @property
    def total_published(self) -> int:
        return sum(self.published.values())

    @property
    def total_rejected(self) -> int:
        return sum(self.rejected.values())

    @property
    def rows(self) -> int:
        """Rows read: published plus rejected."""
        return self.total_published + self.total_rejected

    def render(self) -> str:
        """A small table: published and rejected per tier, then rejections per error."""
        tiers = sorted(set(self.published) | set(self.rejected), key=_tier_order)
        done = "would publish" if self.dry_run else "published"
        lines = [f"{'tier':>10}  {done:>10}  {'rejected':>9}"]
        for tier in tiers:
            lines.append(
                f"{tier:>10}  {self.published.get(tier, 0):>10}  {self.rejected.get(tier, 0):>9}"
            )
        lines.append(f"{'total':>10}  {self.total_published:>10}  {self.total_rejected:>9}")
        if self.duplicate_in_input:
            lines.append(f"duplicate-in-input: {self.duplicate_in_input}")
        lines.extend(rejection_lines(self.errors, self.errors_path, self.total_rejected))
        if self.dry_run:
            lines.append("dry run: nothing was published")
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


def publish_partition(
    url: str,
    topology_data: dict[str, Any],
    *,
    window: int,
    body_json: bool,
) -> Callable[[Iterable[Any]], Iterator[tuple[Any, ...]]]:
    """The function each Spark task runs over its rows (plain data in, tuples out).

    Rows are ``(key, routing_key, delay, due_at_us, due_text, body, id)``. It yields
    one ``("rejected", key, routing_key, delay, tier, error, reason, 1, id)`` per
    rejection and one ``("published", None, None, None, tier, None, None, n, None)``
    per tier.
    """

    def run(rows: Iterable[Any]) -> Iterator[tuple[Any, ...]]:
        from delayq.sync.publisher import Publisher

        topology = Topology.model_validate(topology_data)
        rejections: list[tuple[Rejection, str | None]] = []
        published: Counter[str] = Counter()
        keys: dict[int, tuple[str, str | None]] = {}  # at most `window`: not yet settled
        sent = itertools.count()
        unconfirmed: list[PublishError] = []
        with Publisher(url, topology) as publisher:
            planner = BulkPlanner(topology, factory=publisher.factory, body_json=body_json)

            def stream() -> Iterator[OutgoingMessage]:
                for values in rows:
                    row, row_id = task_row(values)
                    planned = planner.plan(row)
                    if isinstance(planned, Rejection):
                        rejections.append((planned, row_id))
                    else:  # by the stream's index of this message
                        keys[next(sent)] = (str(row.key), row_id)
                        yield planned

            def settle(index: int, msg: OutgoingMessage, error: PublishError | None) -> None:
                key, row_id = keys.pop(index, (None, None))
                if error is None:
                    published[tier_of(msg)] += 1
                elif isinstance(error, (PublishRejected, Unroutable)):
                    rejections.append((planner.rejected(msg, error, key), row_id))
                else:
                    unconfirmed.append(error)

            publisher.send_many(stream(), settle=settle, window=window)
        if unconfirmed:
            # Spark retries the task; what was confirmed is sent again as duplicates.
            raise unconfirmed[0]
        for r, row_id in rejections:
            yield rejected_tuple(r, row_id)
        for tier, count in published.items():
            yield (_PUBLISHED, None, None, None, tier, None, None, count, None)

    return run


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
    dry_run: bool = False,
    duplicates: str = "reject",
    id_col: str | None = None,
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
    the rest was published. ``id_col`` names a column carried into the errors
    output (rows without a usable key stay identifiable).

    Two rows with the same key would be one message id, and an idempotent
    consumer would skip the second: ``duplicates="reject"`` (default) rejects
    every row of such a key (``DuplicateKey``), ``"keep-last"`` publishes the
    last row of each key in input order (see :mod:`delayq.spark._inputs`); the
    summary counts them as ``duplicate_in_input``.

    ``partitions`` repartitions the input first (one connection per
    partition); by default an input of fewer partitions than the session's
    ``defaultParallelism`` is spread over that many. ``progress`` is told (rows
    read, rows in all). ``dry_run`` plans every row against the topology and
    publishes nothing (the broker is still checked: reachable, topology
    applied); ``published`` then counts what would be, and the rejections and
    ``max_rejected`` are as in a real run. The topology must be applied.
    """
    from pyspark import StorageLevel

    url = resolve_url(url)
    limit = RejectionLimit.parse(max_rejected)
    if errors_format not in ("json", "csv", "parquet"):
        raise InvalidInput(f"errors_format must be json, csv or parquet, not {errors_format!r}")
    for name, value in (("window", window), ("partitions", partitions)):
        if value is not None and (isinstance(value, bool) or value < 1):
            raise InvalidInput(f"{name} must be at least 1, got {value!r}")
    selected = input_columns(df, key_col, routing_key_col, delay_col, due_col, body_col, id_col)
    preflight(url, topology)
    prepared = prepare(selected, duplicates=duplicates, partitions=partitions, key_col=key_col)
    spark = df.sparkSession
    counter = RowCounter(spark) if progress is not None else None
    data = topology.model_dump(mode="json")
    task = (
        plan_partition(data, body_json=body_json)
        if dry_run
        else publish_partition(url, data, window=window, body_json=body_json)
    )
    results = prepared.rows.rdd.mapPartitions(counting(task, counter))
    if prepared.rejected is not None:
        results = results.union(prepared.rejected.rdd.map(tuple))
    results = results.persist(StorageLevel.MEMORY_AND_DISK)
    group = f"delayq-schedule-{uuid.uuid4().hex[:8]}"
    spark.sparkContext.setJobGroup(group, "delayq: scheduling messages")
    try:
        # The one action that publishes; the persisted results feed what follows.
        # Were a cached partition lost, recomputing it re-sends its rows:
        # duplicates only, by the key-derived ids.
        if counter is not None and progress is not None:
            with counter.watching(prepared.to_tasks, progress):
                results.count()
        else:
            results.count()
    except Exception as exc:
        results.unpersist()
        error = task_error(exc)
        if error is None:
            raise
        raise error from exc
    finally:
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
        for (kind, tier, error), count in counts:
            if kind == _PUBLISHED:
                published[tier] += count
            else:
                rejected[tier] += count
                errors[error] += count
        rejections: list[dict[str, Any]] = []
        schema = ERRORS_SCHEMA + (f", `{id_col}` string" if id_col else "")
        rows = results.filter(lambda r: r[0] == _REJECTED).map(
            (lambda r: (*r[1:7], r[8])) if id_col else (lambda r: tuple(r[1:7]))
        )
        if errors_path is not None:
            # Written even when empty: rejections of an earlier run left there would
            # pass for this run's.
            out = spark.createDataFrame(rows, schema).coalesce(1)
            writer = out.write.mode("overwrite")
            if errors_format == "csv":
                writer = writer.option("header", "true")
            writer.format(errors_format).save(errors_path)
        elif rejected:
            names = [c.split()[0].strip("`") for c in schema.split(", ")]
            rejections = [dict(zip(names, row, strict=True)) for row in rows.collect()]
    finally:
        results.unpersist()
    summary = ScheduleSummary(
        published=dict(published),
        rejected=dict(rejected),
        errors=dict(errors),
        errors_path=errors_path,
        rejections=rejections,
        duplicate_in_input=prepared.duplicate_in_input,
        dry_run=dry_run,
    )
    if limit.exceeded(rejected=summary.total_rejected, rows=summary.rows):
        raise summary.rejected_error(limit)
    return summary
