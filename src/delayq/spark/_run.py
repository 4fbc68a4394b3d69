"""One scheduling run over one (static) DataFrame: what :func:`delayq.spark.schedule` does
for its input and :func:`delayq.spark.schedule_stream` for each micro-batch.

:class:`Job` holds the settings (checked once, before Spark runs anything); its
:meth:`Job.select` takes the task columns, :meth:`Job.check` checks the broker on the
driver, and :meth:`Job.run` repartitions, runs the tasks (one action that publishes),
and gathers their results into counts and the errors output.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from delayq.errors import DelayqError, InvalidInput
from delayq.spark._checks import preflight, task_error
from delayq.spark._done_parts import RESUMABLE_ROWS, DoneMarks
from delayq.spark._failure import failed_job, finished_partitions, tallied, tally
from delayq.spark._inputs import input_columns, prepare
from delayq.spark._plan_task import plan_partition
from delayq.spark._progress import RowCounter, counting
from delayq.spark._resilient import RetryPolicy
from delayq.spark._salvage import salvage
from delayq.spark._schedule_results import Gathered, gather, summed
from delayq.spark._schedule_task import publish_partition
from delayq.spark._tracing import JobSpan, JobTracing, report_untraced
from delayq.topology.model import Topology

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["Job", "Ran", "check_errors_format"]

Progress = Callable[[int, int], None]
Summarise = Callable[["Ran", "str | None"], Any]
"""The summary of a run, given the run and where its errors output was written (if it was)."""


def check_errors_format(errors_format: str) -> None:
    if errors_format not in ("json", "csv", "parquet"):
        raise InvalidInput(f"errors_format must be json, csv or parquet, not {errors_format!r}")


@dataclass(frozen=True)
class Ran:
    """What one run did: the tasks' results summed, and the input's repeated keys."""

    got: Gathered
    duplicate_in_input: int
    unfinished: int = 0
    """Partitions Spark failed (the run raised :class:`~delayq.errors.SparkJobFailed`)."""


@dataclass(frozen=True)
class Job:
    """A scheduling job's settings (see :func:`delayq.spark.schedule` for each)."""

    url: str
    topology: Topology
    key_col: str
    routing_key_col: str
    delay_col: str | None
    due_col: str | None
    body_col: str | None
    body_json: bool
    errors_format: str
    partitions: int | None
    window: int
    duplicates: str
    id_col: str | None
    policy: RetryPolicy
    dry_run: bool = False
    tracing: JobTracing | None = None
    """The executors' tracing (:mod:`delayq.spark._tracing`); ``None``: none."""
    schedule_index: str | None = None
    """The schedule index each task records its messages in (its URL), or ``None``."""

    @classmethod
    def of(
        cls, *, retry_for: object, backoff: object, tracing: object = None, **settings: Any
    ) -> Job:
        """The settings checked (a bad one raises :class:`~delayq.errors.InvalidInput`)."""
        check_errors_format(settings["errors_format"])
        for name in ("window", "partitions"):
            value = settings[name]
            if value is not None and (isinstance(value, bool) or value < 1):
                raise InvalidInput(f"{name} must be at least 1, got {value!r}")
        policy = RetryPolicy.parse(retry_for, backoff)
        return cls(policy=policy, tracing=JobTracing.of(tracing), **settings)

    def select(self, df: DataFrame) -> DataFrame:
        """The columns the tasks read (a missing column raises
        :class:`~delayq.errors.InvalidInput`)."""
        return input_columns(
            df,
            self.key_col,
            self.routing_key_col,
            self.delay_col,
            self.due_col,
            self.body_col,
            self.id_col,
        )

    def check(self) -> None:
        """The broker reachable and the topology applied, and the schedule index opened
        (on the driver, before the tasks)."""
        preflight(self.url, self.topology)
        if self.schedule_index is not None and not self.dry_run:
            from delayq.schedule.url import open_index

            open_index(self.schedule_index, create=True, what="schedule_index").close()

    def run(
        self,
        selected: DataFrame,
        *,
        errors_path: str | None,
        summarise: Summarise,
        progress: Progress | None = None,
        span: JobSpan | None = None,
        resumable: bool = False,
        skip: frozenset[str] = frozenset(),
    ) -> Ran:
        """Publish (or with ``dry_run`` plan) every row of ``selected`` (:meth:`select`'s);
        the errors output goes to ``errors_path`` (overwritten), else into the result.
        The tasks' ``publish`` spans are children of ``span`` (the run's, on the driver).

        A run Spark fails raises :class:`~delayq.errors.SparkJobFailed`, its ``summary``
        ``summarise(ran, errors_path)`` of what the finished partitions did
        (:mod:`delayq.spark._failure`), their rejected and unconfirmed rows in the errors
        output (:mod:`delayq.spark._salvage`).

        ``resumable`` (a run with an errors output or a resume): partitions of at most
        :data:`~delayq.spark._done_parts.RESUMABLE_ROWS` rows, and those confirmed whole
        marked in ``errors_path`` as they finish; partitions whose digest is in ``skip``
        (a killed run's) are not sent (:mod:`delayq.spark._done_parts`).
        """
        from pyspark import StorageLevel

        try:
            prepared = prepare(
                selected,
                duplicates=self.duplicates,
                partitions=self.partitions,
                key_col=self.key_col,
                max_rows=RESUMABLE_ROWS if resumable else None,
            )
        except DelayqError:
            raise
        except Exception as exc:  # an unreadable input: one line, not pages of stack
            raise failed_job(exc, summarise(Ran(Gathered(), 0), None), 0, 0) from exc
        spark = selected.sparkSession
        counter = RowCounter(spark) if progress is not None else None
        data = self.topology.model_dump(mode="json")
        group = f"delayq-schedule-{uuid.uuid4().hex[:8]}"
        if span is not None:
            span.set({"delayq.spark.job_group": group})
        traced = None
        if self.tracing is not None and not self.dry_run:
            traced = self.tracing.task(span.carrier if span is not None else {})
        task = (
            plan_partition(data, body_json=self.body_json)
            if self.dry_run
            else publish_partition(
                self.url,
                data,
                window=self.window,
                body_json=self.body_json,
                policy=self.policy,
                job=group,
                tracing=traced,
                tracked=resumable and errors_path is not None,
                skip=skip,
                schedule_index=self.schedule_index,
            )
        )
        results = prepared.rows.rdd.mapPartitions(counting(task, counter))
        if prepared.rejected is not None:
            results = results.union(prepared.rejected.rdd.map(tuple))
        tallies = tally(spark.sparkContext)
        results = results.mapPartitionsWithIndex(tallied(tallies)).persist(
            StorageLevel.MEMORY_AND_DISK
        )
        spark.sparkContext.setJobGroup(group, "delayq: scheduling messages")
        marks = (
            DoneMarks(spark, errors_path)
            if resumable and errors_path is not None and not self.dry_run
            else None
        )
        try:
            # The one action that publishes; the persisted results feed what follows.
            # Were a cached partition lost, recomputing it re-sends its rows:
            # duplicates only, by the key-derived ids.
            with marks.watching(tallies) if marks is not None else nullcontext():
                if counter is not None and progress is not None:
                    with counter.watching(prepared.to_tasks, progress):
                        results.count()
                else:
                    results.count()
        except Exception as exc:
            error = task_error(exc)
            if error is None:  # Spark's own failure: what the finished partitions did
                raise self._failed(
                    exc,
                    spark,
                    results,
                    tallies.value,
                    errors_path,
                    summarise,
                    prepared.duplicate_in_input,
                    marks,
                ) from exc
            results.unpersist()
            raise error from exc
        finally:
            spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
            prepared.release()  # the results are persisted: the input's copy is not needed
        report_untraced(tallies.value)
        try:
            got = gather(
                spark,
                results,
                errors_path=errors_path,
                errors_format=self.errors_format,
                id_col=self.id_col,
            )
        finally:
            results.unpersist()
        return Ran(got, prepared.duplicate_in_input)

    def _failed(
        self,
        exc: Exception,
        spark: Any,
        results: Any,
        counts: Any,
        errors_path: str | None,
        summarise: Summarise,
        duplicate_in_input: int,
        marks: DoneMarks | None = None,
    ) -> Exception:
        """The error of a run Spark failed: the finished partitions' counts, and their
        rejected and unconfirmed rows read back into the errors output."""
        partitions = results.getNumPartitions()
        finished = finished_partitions(counts)
        try:
            salvaged = salvage(
                spark,
                results,
                finished,
                errors_path=errors_path,
                errors_format=self.errors_format,
                id_col=self.id_col,
            )
        finally:
            results.unpersist()
        if marks is not None and salvaged.written:  # the errors output replaced them
            with contextlib.suppress(Exception):
                marks.restore()
        got = summed(counts.items())
        got.rejections = salvaged.rows
        partial = Ran(got, duplicate_in_input, max(partitions - len(finished), 1))
        written = errors_path if salvaged.written else None
        return failed_job(
            exc, summarise(partial, written), len(finished), partitions, salvaged.said(errors_path)
        )
