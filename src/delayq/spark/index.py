"""The schedule index as a Spark DataFrame: what is scheduled, for the delivery analytics
and bulk export.

:func:`read_index` reads the entries a :class:`~delayq.schedule.query.Query` matches from
a schedule index (any store: SQLite, PostgreSQL, Redis, memory) on the driver, a page at a
time in due order, and writes each page to ``stage`` as Parquet through Spark, so memory
holds one page and the folder can be anywhere the session writes (a local folder, or
``hdfs://``/``s3a://`` for a cluster, whose executors must read it). The DataFrame reads
that folder: a snapshot of the index when the read ended, whatever moves after. Bodies
are read only when asked (``bodies=True``: an export meant to be imported again).

:func:`index_frame` does it in a temporary folder removed afterwards (a local session);
:func:`forecast` counts the waiting entries due in each minute (or any bucket) of the next
24 hours (or any horizon), empty buckets included; :func:`due_histogram` counts them by
tier and by how soon they are due.

Each entry keeps the delay its publisher asked for (``delay_ms``, since this release):
:func:`requested_delays` counts those of the waiting entries, and :func:`ladder_advice`
says how the ladder serves them and which ladder of as many tiers would serve them
better, as ``delayq spark report`` does from delivery records.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from delayq.durations import to_ms
from delayq.errors import InvalidInput
from delayq.schedule.entry import WAITING, Entry
from delayq.schedule.query import Query
from delayq.schedule.transfer import entry_from
from delayq.schedule.url import open_index

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from delayq.schedule.base import ScheduleStore
    from delayq.topology.fit import LadderFit
    from delayq.topology.ladder import Ladder

__all__ = [
    "DUE_WINDOWS",
    "ENTRY_SCHEMA",
    "check_buckets",
    "due_histogram",
    "entries_of",
    "forecast",
    "index_frame",
    "ladder_advice",
    "read_export",
    "read_index",
    "requested_delays",
]

ENTRY_SCHEMA = (
    "id string, namespace string, routing_key string, destinations array<string>, "
    "state string, tier string, due_at_ms long, published_at_ms long, size long, "
    "business_key string, labels map<string,string>, generation long, changed_at_ms long, "
    "body binary, content_type string, headers string, delay_ms long"
)
"""An entry's columns (times in epoch milliseconds; ``headers`` as JSON text; ``body``,
``content_type`` and ``headers`` null unless read with ``bodies=True`` and kept)."""

PAGE = 50_000
"""Entries a page: each one a Spark write of its own."""

DUE_WINDOWS: tuple[tuple[str, int], ...] = (
    ("overdue", 0),
    ("1m", 60_000),
    ("5m", 300_000),
    ("1h", 3_600_000),
    ("24h", 86_400_000),
)
""":func:`due_histogram`'s windows: due already (not yet taken), then within each
duration from now (the first that holds it: the gauges' windows of
:mod:`delayq.schedule.gauges`, not summed); what is due later is ``later``."""


def _row(entry: Entry, bodies: bool) -> tuple[Any, ...]:
    kept = bodies and entry.kept
    return (
        entry.id, entry.namespace, entry.routing_key, list(entry.destinations),
        entry.state.value, entry.tier, entry.due_at_ms, entry.published_at_ms, entry.size,
        entry.business_key, dict(entry.labels), entry.generation, entry.changed_at_ms,
        bytearray(entry.body) if kept and entry.body is not None else None,
        entry.content_type if kept else None,
        json.dumps(dict(entry.headers)) if kept and entry.headers is not None else None,
        entry.delay_ms,
    )  # fmt: skip


def _store(index: ScheduleStore | str) -> tuple[ScheduleStore, bool]:
    if isinstance(index, str):
        return open_index(index, what="the schedule index"), True
    if not callable(getattr(index, "find", None)):
        raise InvalidInput(f"index is a schedule index's URL or store, not {index!r}")
    return index, False


def _empty_stage(stage: str) -> None:
    """A local ``stage`` must be missing or empty: a page is appended to what is there."""
    if "://" in stage and not stage.startswith("file://"):
        return  # Spark's own filesystems: the write itself refuses nothing, checked there
    path = Path(stage.removeprefix("file://"))
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise InvalidInput(f"stage {stage!r} exists and is not an empty folder: give a new one")
    for parent in path.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise InvalidInput(f"stage {stage!r}: {parent} is a file, not a folder")
            break


def read_index(
    spark: SparkSession,
    index: ScheduleStore | str,
    stage: str,
    *,
    query: Query | None = None,
    bodies: bool = False,
    page: int = PAGE,
    progress: Callable[[int], None] | None = None,
) -> DataFrame:
    """The entries of ``index`` (a store, or its URL) that ``query`` matches (default:
    every waiting one), written to ``stage`` (a new folder) as Parquet and read back.
    ``progress`` is told the entries written so far after each page."""
    if isinstance(page, bool) or not isinstance(page, int) or page < 1:
        raise InvalidInput(f"page is a whole number of entries above 0, not {page!r}")
    if not isinstance(stage, str) or not stage.strip():
        raise InvalidInput(f"stage is a folder's path or URL, not {stage!r}")
    _empty_stage(stage)
    store, opened = _store(index)
    query = Query() if query is None else query
    written, after = 0, None
    try:
        while True:
            rows: list[tuple[Any, ...]] = []
            while len(rows) < page:
                found = store.find(query, after=after, limit=min(1000, page - len(rows)))
                rows += [_row(e, bodies) for e in found]
                if not found:
                    break
                after = (found[-1].due_at_ms, found[-1].id)
            if rows or not written:  # an empty index still gets its (empty) files
                frame = spark.createDataFrame(rows, ENTRY_SCHEMA)
                try:
                    frame.write.mode("append").parquet(stage)
                except Exception as exc:  # Spark's own: a path it cannot write
                    raise InvalidInput(f"cannot write {stage!r}: {_first_line(exc)}") from None
                written += len(rows)
                if progress is not None:
                    progress(written)
            if len(rows) < page:
                break
    finally:
        if opened:
            store.close()
    return spark.read.schema(ENTRY_SCHEMA).parquet(stage)


@contextmanager
def index_frame(
    spark: SparkSession,
    index: ScheduleStore | str,
    *,
    query: Query | None = None,
    bodies: bool = False,
    page: int = PAGE,
) -> Iterator[DataFrame]:
    """:func:`read_index` into a temporary folder, removed when the block ends (its
    DataFrame is not read after that). The folder is on the driver's disk: a session
    whose executors cannot read it (a cluster) calls :func:`read_index` with a ``stage``
    they can."""
    master = spark.sparkContext.master or ""
    if not master.startswith("local"):
        raise InvalidInput(
            f"index_frame stages the index on the driver's disk, which the executors of "
            f"{master!r} cannot read: call read_index with a stage they can (hdfs://, s3a://)"
        )
    folder = tempfile.mkdtemp(prefix="delayq-index-")
    try:
        yield read_index(
            spark, index, str(Path(folder) / "entries"), query=query, bodies=bodies, page=page
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _waiting(df: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    return df.where(F.col("state").isin([s.value for s in WAITING]))


def check_buckets(horizon: object, bucket: object) -> tuple[int, int]:
    """:func:`forecast`'s ``horizon`` and ``bucket`` in milliseconds, checked: a bucket
    above 0 and at most the horizon, a million buckets at most."""
    horizon_ms = to_ms(horizon, what="horizon")
    bucket_ms = to_ms(bucket, what="bucket")
    if bucket_ms <= 0 or horizon_ms < bucket_ms:
        raise InvalidInput(
            f"bucket is a duration above 0 and at most the horizon ({bucket!r}, {horizon!r})"
        )
    if horizon_ms // bucket_ms > 1_000_000:
        raise InvalidInput(f"{horizon!r} in buckets of {bucket!r} is over a million buckets")
    return horizon_ms, bucket_ms


def forecast(
    df: DataFrame, *, now_ms: int, horizon: object = "24h", bucket: object = "1m"
) -> DataFrame:
    """Waiting entries of ``df`` due in the ``horizon`` after ``now_ms``, counted by
    ``bucket``: columns ``start`` (a timestamp, UTC), ``start_ms`` and ``due``, one row a
    bucket, empty ones included, in order. Buckets start on whole multiples of ``bucket``
    since the epoch (a minute's on the minute), so the first and last are cut at
    ``now_ms`` and the horizon's end. Those due before ``now_ms`` (not taken yet) are not
    in it: :func:`due_histogram` counts them as ``overdue``."""
    from pyspark.sql import functions as F

    horizon_ms, bucket_ms = check_buckets(horizon, bucket)
    base = now_ms - now_ms % bucket_ms  # buckets on whole minutes (UTC), or whole buckets
    buckets = -(-(now_ms + horizon_ms - base) // bucket_ms)
    spark = df.sparkSession
    due = (
        _waiting(df)
        .where((F.col("due_at_ms") >= now_ms) & (F.col("due_at_ms") < now_ms + horizon_ms))
        .select(F.floor((F.col("due_at_ms") - base) / bucket_ms).cast("long").alias("n"))
        .groupBy("n")
        .count()
    )
    every = spark.range(buckets).withColumnRenamed("id", "n")
    return (
        every.join(due, "n", "left")
        .select(
            (F.lit(base) + F.col("n") * bucket_ms).alias("start_ms"),
            F.coalesce(F.col("count"), F.lit(0)).alias("due"),
        )
        .withColumn("start", F.timestamp_millis(F.col("start_ms")))
        .select("start", "start_ms", "due")
        .orderBy("start_ms")
    )


def due_histogram(df: DataFrame, *, now_ms: int) -> DataFrame:
    """Waiting entries of ``df`` by ``tier`` and ``window`` (:data:`DUE_WINDOWS`: the
    first each is due within, from ``now_ms``; ``later`` past the last), with ``due``
    (their count) and ``bytes`` (their bodies' sizes)."""
    from pyspark.sql import functions as F

    left = F.col("due_at_ms") - now_ms
    window = F.when(left < 0, F.lit(0))
    for rank, (_, ms) in enumerate(DUE_WINDOWS[1:], 1):
        window = window.when(left < ms, F.lit(rank))
    names = F.array(*[F.lit(name) for name, _ in DUE_WINDOWS], F.lit("later"))
    return (
        _waiting(df)
        .withColumn("rank", window.otherwise(F.lit(len(DUE_WINDOWS))))
        .groupBy("tier", "rank")
        .agg(F.count(F.lit(1)).alias("due"), F.sum("size").alias("bytes"))
        .orderBy("tier", "rank")
        .select("tier", F.element_at(names, F.col("rank") + 1).alias("window"), "due", "bytes")
    )


def _first_line(exc: BaseException) -> str:
    """What Spark said, in one line (its Java stack left out)."""
    text = str(exc).strip()
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("An error occurred", "at ", "JVM stacktrace")):
            return line[:300]
    return type(exc).__name__


def read_export(spark: SparkSession, path: str) -> DataFrame:
    """An export :func:`read_index` wrote (``delayq spark export``), read back: refused
    (:class:`~delayq.errors.InvalidInput`) where ``path`` holds other data."""
    try:
        df = spark.read.parquet(path)
    except Exception as exc:  # Spark's own: no Parquet there, a file that is not
        raise InvalidInput(f"cannot read {path!r} as Parquet: {_first_line(exc)}") from None
    wanted = [c.split()[0] for c in ENTRY_SCHEMA.split(", ")]
    missing = [c for c in wanted if c not in df.columns]
    if missing:
        raise InvalidInput(
            f"{path!r} is not an export of the schedule index (delayq spark export): it has "
            f"no {', '.join(missing)}"
        )
    return df.select(*wanted)


def entries_of(df: DataFrame) -> Iterator[Entry]:
    """The rows of an export as entries, a partition at a time on the driver, each
    checked (:class:`~delayq.errors.InvalidInput` naming the row's id)."""
    for row in df.toLocalIterator():
        given = row.asDict()
        where = f"entry {given.get('id')!r} of the export"
        headers, body = given["headers"], given["body"]
        try:
            given["headers"] = None if headers is None else json.loads(headers)
        except ValueError as exc:
            raise InvalidInput(f"{where}: headers are not JSON ({exc})") from None
        given["destinations"] = list(given["destinations"] or ())
        given["labels"] = given["labels"] or {}
        yield entry_from(given, None if body is None else bytes(body), where)


def requested_delays(df: DataFrame) -> dict[int, int]:
    """The delays the waiting entries' publishers asked for: delay ms -> entries (those
    an older delayq recorded without one left out)."""
    from pyspark.sql import functions as F

    found = _waiting(df).where(F.col("delay_ms").isNotNull()).groupBy("delay_ms").count()
    return {r["delay_ms"]: r["count"] for r in found.collect()}


def ladder_advice(
    delays: dict[int, int], ladder: Ladder, *, objective: str = "mean"
) -> tuple[LadderFit | None, LadderFit | None, str]:
    """How ``ladder`` serves ``delays`` (:func:`requested_delays`), a ladder of as many
    round tiers that serves them better (``None`` where none does), and why there is
    none: :func:`delayq.topology.fit.recommend_on_grid` with the current top kept."""
    from delayq.topology.fit import (
        DEFAULT_GRID_MS,
        ladder_overshoot,
        never_worse,
        recommend_on_grid,
    )

    if not any(d > 0 for d in delays):
        return None, None, "no waiting entry asked for a delay"
    current = ladder_overshoot(delays, [t.ttl_ms for t in ladder])
    recommended, refused = None, ""
    try:
        recommended = recommend_on_grid(
            delays, len(ladder), min_top_ms=ladder.max_ms, objective=objective
        )
    except InvalidInput as exc:  # a delay beyond the grid
        refused = str(exc)
    recommended, _, refused = never_worse(
        current, recommended, None, refused, delays, DEFAULT_GRID_MS, objective
    )
    if recommended is not None and recommended.tiers_ms == current.tiers_ms:
        return current, None, "the ladder is already the best of its size on the grid"
    return current, recommended, refused
