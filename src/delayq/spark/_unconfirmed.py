"""A scheduling job's unconfirmed rows: how its summary and error speak of them, and
how a later run takes just them (``resume_from`` / ``--resume``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from delayq.durations import format_ms
from delayq.errors import InvalidInput, RowsUnconfirmed
from delayq.spark._resilient import RetryPolicy
from delayq.spark._schedule_task import UNCONFIRMED_ERROR
from delayq.wording import counted

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["check_resume_paths", "only_unconfirmed", "outage_lines", "unconfirmed_error"]

_PREFIX = "unconfirmed: "


class _Counts(Protocol):
    """What a :class:`~delayq.spark.ScheduleSummary` tells of the job (see there)."""

    @property
    def errors_path(self) -> str | None: ...

    @property
    def retried(self) -> int: ...

    @property
    def rerun(self) -> int: ...

    @property
    def total_published(self) -> int: ...

    @property
    def total_rejected(self) -> int: ...

    @property
    def total_unconfirmed(self) -> int: ...

    @property
    def rows(self) -> int: ...


def outage_lines(summary: _Counts) -> list[str]:
    """The summary's lines on outages: rows unconfirmed, and rows sent again."""
    lines = []
    if summary.total_unconfirmed:
        where = (
            f"in {summary.errors_path}" if summary.errors_path else "in the summary's rejections"
        )
        lines.append(
            f"unconfirmed: {summary.total_unconfirmed:,} (NOT published; {where} with error "
            f"{UNCONFIRMED_ERROR}: run again with --resume to send just them)"
        )
    if summary.retried:
        lines.append(
            f"retried: {counted(summary.retried, 'published row')} sent again after a lost "
            "connection (each counted once; consumers skip a duplicate)"
        )
    if summary.rerun:
        lines.append(
            f"rerun: {counted(summary.rerun, 'published row')} of tasks Spark ran again "
            "(the failed attempt may have sent them too: consumers skip a duplicate)"
        )
    return lines


def unconfirmed_error(
    summary: _Counts, failures: Sequence[Sequence[Any]], policy: RetryPolicy
) -> RowsUnconfirmed:
    """The error of a job that ended with unconfirmed rows (``failures``: each stalled
    task's ``(error, reason)``)."""
    causes = sorted({str(reason).removeprefix(_PREFIX) for _, reason in failures})
    cause = "; ".join(causes) or f"no confirm within retry_for={format_ms(policy.retry_for_ms)}"
    where = (
        f"{summary.errors_path} names them (error {UNCONFIRMED_ERROR}): run the same input "
        f"again with --resume {summary.errors_path} (resume_from=) to send just them, "
        "with --errors elsewhere"
        if summary.errors_path
        else "the summary's rejections name them (error PublishUnconfirmed); give --errors DIR "
        "(errors_path=) to write them out for --resume"
    )
    index = any(str(error) in _INDEX_ERRORS for error, _ in failures)
    return RowsUnconfirmed(
        f"{summary.total_unconfirmed:,} of {summary.rows:,} rows were not confirmed by the "
        + ("broker or not sent: the schedule index failed" if index else "broker")
        + f" ({cause}) and are NOT counted as published; {where}. "
        f"{summary.total_published:,} were published (confirmed"
        + (f", {summary.retried:,} of them after a retry" if summary.retried else "")
        + f"), {summary.total_rejected:,} rejected. "
        + (
            "Mend the index (--schedule-index), then resume. A window confirmed before "
            "its entries could be moved shows pending in the index: its rows are counted "
            "published and a resume never sends them again"
            if index
            else "A longer outage needs a longer retry_for (--retry-for)"
        ),
        summary,
    )


_INDEX_ERRORS = ("StoreError", "ScheduleNotRecorded")
"""A task's failure the schedule index caused (not the broker)."""


def check_resume_paths(resume_from: str, errors_path: str | None) -> None:
    """A run never writes its errors output over the one it resumes."""
    if errors_path is not None and _same(errors_path, resume_from):
        raise InvalidInput(
            f"resume_from and errors_path are both {resume_from}: this run's errors output "
            "would overwrite the list it reads; write it elsewhere"
        )


def only_unconfirmed(selected: DataFrame, resume_from: str, fmt: str, schema: str) -> DataFrame:
    """``selected`` cut down to the rows whose key ``resume_from`` (an errors output in
    ``fmt``) names as unconfirmed."""
    from pyspark.sql import functions as F

    reader = selected.sparkSession.read.schema(schema)
    if fmt == "csv":
        reader = reader.option("header", "true")
    try:
        previous = reader.format(fmt).load(resume_from)
        previous.limit(1).collect()  # a missing or unreadable path fails here, on the driver
    except Exception as exc:  # Spark's AnalysisException: one line, not a traceback
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InvalidInput(
            f"cannot read the errors output {resume_from} as {fmt}: {first}"
        ) from exc
    keys = previous.where(F.col("error") == UNCONFIRMED_ERROR).select("key").distinct()
    return selected.join(keys, "key", "left_semi")


def _same(a: str, b: str) -> bool:
    if "://" in a or "://" in b:
        return a.rstrip("/") == b.rstrip("/")
    return Path(a).resolve() == Path(b).resolve()
