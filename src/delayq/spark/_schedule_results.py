"""A scheduling job's task results, gathered on the driver: the counts of its summary, and
the errors output (rejected and unconfirmed rows, with the ``id_col`` when given)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from delayq.spark._done_parts import SKIPPED
from delayq.spark._plan_task import PUBLISHED, REJECTED
from delayq.spark._schedule_task import FAILED, RERUN, RETRIED, UNCONFIRMED

__all__ = [
    "ERRORS_SCHEMA",
    "Gathered",
    "column_names",
    "error_row",
    "errors_schema",
    "gather",
    "summed",
    "write_errors",
]

ERRORS_SCHEMA = (
    "key string, routing_key string, delay string, tier string, error string, reason string"
)
"""The errors output: one line per row not published (DDL of its Spark schema)."""


def errors_schema(id_col: str | None) -> str:
    """:data:`ERRORS_SCHEMA`, and the ``id_col`` column after it when there is one."""
    return ERRORS_SCHEMA + (f", `{id_col}` string" if id_col else "")


@dataclass
class Gathered:
    """What the tasks said, summed."""

    published: Counter[str] = field(default_factory=Counter)
    rejected: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    unconfirmed: Counter[str] = field(default_factory=Counter)
    retried: int = 0
    rerun: int = 0
    skipped: int = 0
    """Rows of partitions a resumed run skipped: the killed run got them confirmed."""
    failures: list[Any] = field(default_factory=list)
    """``(error, reason)`` of each task that stopped with rows unconfirmed."""
    rejections: list[dict[str, Any]] = field(default_factory=list)
    """The rejected and unconfirmed rows, when they were not written out."""


def summed(counts: Iterable[tuple[tuple[Any, ...], int]]) -> Gathered:
    """The counts ``((kind, tier, error), n)`` of result tuples, summed by kind."""
    out = Gathered()
    for (kind, tier, error), count in counts:
        if kind == PUBLISHED:
            out.published[tier] += count
        elif kind == REJECTED:
            out.rejected[tier] += count
            out.errors[error] += count
        elif kind == UNCONFIRMED:
            out.unconfirmed[tier] += count
        elif kind == RETRIED:
            out.retried += count
        elif kind == RERUN:
            out.rerun += count
        elif kind == SKIPPED:
            out.skipped += count
    return out


def gather(
    spark: Any,
    results: Any,
    *,
    errors_path: str | None,
    errors_format: str,
    id_col: str | None,
) -> Gathered:
    """Sum the result tuples (an RDD of ``(kind, key, routing_key, delay, tier, error,
    reason, n, id)``) and write the errors output to ``errors_path``, or keep its rows."""
    counts = (
        results.map(lambda r: ((r[0], r[4], r[5]), r[7])).reduceByKey(lambda a, b: a + b).collect()
    )
    out = summed(counts)
    out.failures = results.filter(lambda r: r[0] == FAILED).map(lambda r: r[5:7]).collect()
    schema = errors_schema(id_col)
    rows = results.filter(lambda r: r[0] in (REJECTED, UNCONFIRMED)).map(
        lambda r: error_row(r, id_col)
    )
    if errors_path is not None:
        # Written even when empty: rejections of an earlier run left there would pass
        # for this run's.
        write_errors(spark, rows, schema, errors_path, errors_format)
    elif out.rejected or out.unconfirmed:
        out.rejections = [column_names(schema, row) for row in rows.collect()]
    return out


def error_row(result: tuple[Any, ...], id_col: str | None) -> tuple[Any, ...]:
    """A rejected or unconfirmed row's result tuple as a row of the errors output."""
    return (*result[1:7], result[8]) if id_col else tuple(result[1:7])


def column_names(schema: str, row: tuple[Any, ...]) -> dict[str, Any]:
    """A row of the errors output (of ``schema``) as a dict."""
    names = [c.split()[0].strip("`") for c in schema.split(", ")]
    return dict(zip(names, row, strict=True))


def write_errors(
    spark: Any,
    rows: Any,
    schema: str,
    errors_path: str,
    errors_format: str,
    mode: str = "overwrite",
) -> None:
    """Write ``rows`` (an RDD or a list) as one file of the errors output at ``errors_path``."""
    writer = spark.createDataFrame(rows, schema).coalesce(1).write.mode(mode)
    if errors_format == "csv":
        writer = writer.option("header", "true")
    writer.format(errors_format).save(errors_path)
