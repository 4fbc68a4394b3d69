"""The input side of a scheduling job: the columns its tasks read, repeated keys, partitions.

* Every row gets its position in the input as it was read (:data:`ROW`,
  ``monotonically_increasing_id`` taken before any shuffle: partition by partition in
  the order Spark lists the input's files and splits, rows in file order within each).
  "The last row of a key" (``duplicates="keep-last"``) is the one with the greatest
  position: for a single file, the last line.
* A key on several rows is one message id, so an idempotent consumer would handle the
  first message and skip the others. ``duplicates="reject"`` (the default) rejects every
  row of such a key (error ``DuplicateKey``, in the errors output); ``"keep-last"``
  publishes the last row of each and counts the others as ``duplicate-in-input``.
* Without ``partitions``, the tasks are ``max(the input's partitions,
  defaultParallelism)`` (one connection each). The input is taken as read when its
  partitions are that many and even (none over 1.5 times an even share); otherwise it
  is spread over them (round robin): a single big file, read as one split holding every
  row (a Parquet file of one row group) or as fewer splits than the cluster has cores,
  does not run on one connection. ``partitions`` always repartitions. A run that can be
  resumed (an errors output, or a resume) has at least enough tasks that none holds
  more than ``max_rows`` rows (:data:`~delayq.spark._done_parts.RESUMABLE_ROWS`): a kill
  then leaves at most that many rows unknown per running task.
* The input is read once: the selected columns are persisted (memory, spilling to
  disk) by the first job, the one counting rows and repeated keys; the join that
  sets the repeated keys' rows apart and the publishing job read that copy, not the
  source (a file is not read twice, a source that changes between reads cannot
  give the tasks other rows than were counted). :meth:`Prepared.release` drops it
  once the tasks' results are persisted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from delayq.errors import InvalidInput
from delayq.message.bulk import NO_TIER

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["DUPLICATES", "ROW", "Prepared", "input_columns", "prepare"]

ROW = "_delayq_row"
"""The column of each row's position in the input."""

DUPLICATES = ("reject", "keep-last")
DUPLICATE_KEY = "DuplicateKey"
_TASK_COLUMNS = ("key", "routing_key", "delay", "due_us", "due_text", "body", "id")
_ERRORS_COLUMNS = ("key", "routing_key", "delay", "tier", "error", "reason")


def input_columns(
    df: DataFrame,
    key_col: str,
    routing_key_col: str,
    delay_col: str | None,
    due_col: str | None,
    body_col: str | None,
    id_col: str | None = None,
) -> DataFrame:
    """The columns a task reads (due times as epoch microseconds, the id as a string) and
    :data:`ROW`."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DateType, StringType, TimestampNTZType, TimestampType

    if (delay_col is None) == (due_col is None):
        raise InvalidInput("give exactly one of delay_col and due_col")
    if id_col is not None and id_col in _ERRORS_COLUMNS:
        raise InvalidInput(
            f"id_col {id_col!r} would clash with the errors output's own column of that "
            f"name ({', '.join(_ERRORS_COLUMNS)}); rename it in the input"
        )
    missing = [
        c
        for c in (key_col, routing_key_col, delay_col, due_col, body_col, id_col)
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
        (F.col(id_col).cast("string") if id_col else null_str).alias("id"),
        F.monotonically_increasing_id().alias(ROW),
    )


@dataclass(frozen=True)
class Prepared:
    """The rows to hand to the tasks, and what was settled before them."""

    rows: DataFrame
    """The task columns (see :func:`input_columns`, without :data:`ROW`)."""
    rows_read: int
    to_tasks: int
    """Rows the tasks will read: ``rows_read`` less the repeated keys' rows set aside."""
    duplicate_in_input: int
    """Rows whose key is on another row too: rejected, or (keep-last) left out."""
    rejected: DataFrame | None
    """Repeated keys' rows rejected (``duplicates="reject"``), as result tuples."""
    read: DataFrame | None = None
    """The input as read once, persisted: what ``rows`` and ``rejected`` come from."""

    def release(self) -> None:
        """Drop the persisted input (once the tasks' results no longer need it)."""
        if self.read is not None:
            self.read.unpersist()


def prepare(
    selected: DataFrame,
    *,
    duplicates: str,
    partitions: int | None,
    key_col: str,
    max_rows: int | None = None,
) -> Prepared:
    """The input read once (persisted), repeated keys handled (one aggregation over that
    copy), then partitions set; without ``partitions``, none holds more than
    ``max_rows`` (a run that can be resumed: :mod:`delayq.spark._done_parts`)."""
    from pyspark import StorageLevel

    if duplicates not in DUPLICATES:
        raise InvalidInput(f"duplicates must be reject or keep-last, not {duplicates!r}")
    read = selected.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        prepared = _prepare(
            read, duplicates=duplicates, partitions=partitions, key_col=key_col, max_rows=max_rows
        )
    except BaseException:
        read.unpersist()
        raise
    return prepared


def _prepare(
    selected: DataFrame,
    *,
    duplicates: str,
    partitions: int | None,
    key_col: str,
    max_rows: int | None,
) -> Prepared:
    from pyspark.sql import functions as F

    key = F.col("key")
    per_key = selected.groupBy("key").agg(
        F.count(F.lit(1)).alias("n"), F.max(ROW).alias("last")
    )
    repeated = per_key.where(key.isNotNull() & (key != "") & (F.col("n") > 1))
    totals = per_key.agg(
        F.sum("n").alias("rows"),
        F.sum(F.when(key.isNotNull() & (key != "") & (F.col("n") > 1), F.col("n"))).alias(
            "dup_rows"
        ),
        F.count(F.when(key.isNotNull() & (key != "") & (F.col("n") > 1), 1)).alias("dup_keys"),
    ).first()
    rows_read = int(totals["rows"] or 0) if totals else 0
    dup_rows = int(totals["dup_rows"] or 0) if totals else 0
    dup_keys = int(totals["dup_keys"] or 0) if totals else 0
    source_partitions = selected.rdd.getNumPartitions()
    rows, rejected = selected, None
    counted = 0
    if dup_keys:
        joined = selected.join(repeated, "key", "left")
        if duplicates == "keep-last":
            rows = joined.where(F.col("n").isNull() | (F.col(ROW) == F.col("last")))
            counted = dup_rows - dup_keys
        else:
            rows = joined.where(F.col("n").isNull())
            counted = dup_rows
            given = F.coalesce(F.col("due_text"), F.col("delay").cast("string"))
            reason = F.format_string(
                f"key %s is on %d rows of the input (column {key_col!r}): one message id, "
                "so an idempotent consumer would handle the first and skip the others; "
                "every one is rejected. Make the key unique (e.g. the key and the due "
                "time together), or keep the last row of each key (--duplicates keep-last)",
                F.concat(F.lit("'"), key, F.lit("'")),
                F.col("n"),
            )
            rejected = joined.where(F.col("n").isNotNull()).select(
                F.lit("rejected"),
                key,
                F.col("routing_key"),
                given,
                F.lit(NO_TIER),
                F.lit(DUPLICATE_KEY),
                reason,
                F.lit(1),
                F.col("id"),
            )
    rows = rows.select(*_TASK_COLUMNS)
    target = partitions or max(
        source_partitions,
        _default_parallelism(selected),
        -(-(rows_read - counted) // max_rows) if max_rows else 1,
    )
    if partitions is not None:
        rows = rows.repartition(target)
    elif dup_keys:  # the join's shuffle spread the rows by key: as many as the input had
        joined_partitions = rows.rdd.getNumPartitions()
        if joined_partitions < target:
            rows = rows.repartition(target)
        elif joined_partitions > target:
            rows = rows.coalesce(target)
    elif source_partitions < target or not _even(selected, rows_read, target):
        rows = rows.repartition(target)
    return Prepared(rows, rows_read, rows_read - counted, counted, rejected, selected)


def _even(selected: DataFrame, rows: int, target: int) -> bool:
    """Whether the input's partitions, as read, spread its rows over ``target`` tasks
    evenly enough: none holds more than 1.5 times an even share. A single Parquet file
    of one row group is read as several splits, all but one empty: not even."""
    from pyspark.sql import functions as F

    if rows == 0:
        return True
    # monotonically_increasing_id puts the partition index in the upper 31 bits
    per_partition = selected.groupBy(F.shiftright(F.col(ROW), 33)).count().collect()
    return max(int(r["count"]) for r in per_partition) <= 1.5 * rows / target


def _default_parallelism(df: DataFrame) -> int:
    return int(df.sparkSession.sparkContext.defaultParallelism)
