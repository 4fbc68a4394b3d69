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

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from delayq.errors import InvalidInput, RowsRejected, SparkJobFailed
from delayq.message.bulk import RejectionLimit
from delayq.spark._done_parts import read_done
from delayq.spark._rejections import rejection_lines, rejections_said
from delayq.spark._run import Job, Ran
from delayq.spark._run_record import (
    RunRecord,
    input_identity,
    read_record,
    resume_plan,
    write_record,
)
from delayq.spark._schedule_results import ERRORS_SCHEMA, errors_schema
from delayq.spark._schedule_task import publish_partition
from delayq.spark._tracing import ProviderFactory, job_span
from delayq.spark._unconfirmed import (
    check_resume_paths,
    only_unconfirmed,
    outage_lines,
    unconfirmed_error,
)
from delayq.topology.model import Topology
from delayq.urls import check_vhost, resolve_url

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["ERRORS_SCHEMA", "ScheduleSummary", "publish_partition", "schedule"]

Progress = Callable[[int, int], None]
"""Told (done, in all) while the job runs: Spark tasks (cancel), rows read (schedule)."""


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
    unconfirmed: dict[str, int] = field(default_factory=dict)
    """Rows per tier the broker did not confirm (never counted as published; in the
    errors output with error ``PublishUnconfirmed``, reason ``unconfirmed: ...``)."""
    retried: int = 0
    """Published rows confirmed only after being sent again over a new connection: at
    most this many duplicates at the broker, which idempotent consumers skip."""
    rerun: int = 0
    """Published rows of tasks Spark ran again (a lost executor, a failing UDF): the
    failed attempt may have sent them too, so at most this many duplicates, which
    idempotent consumers skip."""
    unfinished: int = 0
    """Partitions Spark failed (:class:`~delayq.errors.SparkJobFailed`): the figures
    count the finished ones only; these may have published part of their rows."""
    resumed: str = ""
    """With ``resume_from``: which run was resumed, and whether just its unconfirmed rows
    or (its errors output never finished) every row but those of the partitions it got
    confirmed whole was sent again."""
    skipped: int = 0
    """Rows of a resumed run (killed or failed) it got confirmed, not sent again: in
    none of the figures above."""

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
        lines.extend(outage_lines(self))
        if self.resumed:
            lines.append(self.resumed)
        if self.skipped:
            lines.append(
                f"skipped: {self.skipped:,} rows the resumed run got confirmed, not sent again"
            )
        if self.dry_run:
            lines.append("dry run: nothing was published")
        if self.unfinished:
            lines.append(
                f"job failed: {self.unfinished} partition(s) unfinished, counted nowhere "
                "(the figures above are the finished partitions')"
            )
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
    retry_for: object = "60s",
    backoff: object = "200ms",
    resume_from: str | None = None,
    tracing: ProviderFactory | Literal[False] | None = None,
    schedule_index: str | None = None,
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
    ``defaultParallelism``, or of partitions holding its rows unevenly, is spread
    over that many (the input is read once: see :mod:`delayq.spark._inputs`).
    ``progress`` is told (rows read, rows in all). ``dry_run`` plans every row
    against the topology and publishes nothing (the broker is still checked: reachable, topology
    applied); ``published`` then counts what would be, and the rejections and
    ``max_rejected`` are as in a real run. The topology must be applied.

    A partition whose connection drops sends what was not confirmed again on a new
    one, pausing ``backoff`` (doubled each time, up to 5 s) between attempts, for as
    long as the broker confirms nothing for less than ``retry_for`` (durations; a
    confirm resets the clock). Rows still unconfirmed then are neither published nor
    rejected: the summary's ``unconfirmed``, written to the errors output (error
    ``PublishUnconfirmed``, reason ``unconfirmed: ...``, the ``id_col`` too), and the job raises
    :class:`~delayq.errors.RowsUnconfirmed` (its ``summary`` the job's) once every
    partition is accounted for. ``resume_from`` (a previous run's errors output) keeps
    only the rows it names as unconfirmed: the same input and ``resume_from`` send just
    what that run left unconfirmed. Its run record (``_delayq_run.json``, written before anything is
    sent: :mod:`delayq.spark._run_record`) decides: of a run that never finished
    (killed), the partitions it got confirmed whole are skipped (``skipped`` in the
    summary) and every other row is sent again (:mod:`delayq.spark._done_parts`); another
    input, a dry run's output or a run with nothing unconfirmed are refused
    (:class:`~delayq.errors.InvalidInput`). A run with ``errors_path`` or ``resume_from``
    and no ``partitions`` has partitions of at most 10,000 rows, so that a kill leaves
    little unknown.

    A job Spark fails for a reason of its own (an unreadable input file, a task's
    Python worker or executor lost too often) raises
    :class:`~delayq.errors.SparkJobFailed`: the cause in one line, a ``summary``
    of the partitions that finished (:mod:`delayq.spark._failure`), and their rejected
    and unconfirmed rows in the errors output (:mod:`delayq.spark._salvage`).

    ``tracing``: a function of no argument returning an OpenTelemetry ``TracerProvider``
    (its exporter set up), called once in each Spark Python worker: every message gets
    a ``publish`` span, all children of the job's ``schedule <namespace>`` span on the
    driver (:mod:`delayq.spark._tracing`). ``None`` (default) or ``False``: no spans.

    ``schedule_index``: the URL of a schedule index (a SQLite file, ``postgresql://``,
    ``redis://``; :func:`~delayq.schedule.url.open_index`) that every message is recorded
    in, as a publisher with ``schedule=`` records it (docs/guides/scheduled.md). It is
    opened on the driver first (a new SQLite file made there), then by each task:
    executors on other hosts need PostgreSQL or Redis. An index a task cannot write fails
    that partition's rest as unconfirmed, nothing of it sent.
    """
    url = resolve_url(url)
    check_vhost(topology.declared_vhost, url)
    limit = RejectionLimit.parse(max_rejected)
    job = Job.of(
        url=url,
        topology=topology,
        key_col=key_col,
        routing_key_col=routing_key_col,
        delay_col=delay_col,
        due_col=due_col,
        body_col=body_col,
        body_json=body_json,
        errors_format=errors_format,
        partitions=partitions,
        window=window,
        duplicates=duplicates,
        id_col=id_col,
        dry_run=dry_run,
        retry_for=retry_for,
        backoff=backoff,
        tracing=tracing,
        schedule_index=schedule_index,
    )
    if df.isStreaming:
        raise InvalidInput(
            "df is a streaming DataFrame (readStream): schedule it with "
            "delayq.spark.schedule_stream (delayq spark stream), which needs a checkpoint"
        )
    with job_span(job.tracing, topology.namespace, {"delayq.dry_run": dry_run}) as span:
        selected = job.select(df)
        spark = df.sparkSession
        identity = input_identity(df, selected) if errors_path or resume_from else {}
        resumed = ""
        skip: frozenset[str] = frozenset()
        if resume_from is not None:
            check_resume_paths(resume_from, errors_path)
            previous = read_record(spark, resume_from)
            marked = (
                read_done(spark, resume_from)
                if previous is not None and previous.state != "complete"
                else frozenset()
            )
            plan = resume_plan(previous, identity, resume_from, marked)
            skip = plan.skip
            if plan.only_unconfirmed:
                schema = errors_schema(id_col)
                fmt = plan.record.errors_format
                selected = only_unconfirmed(selected, resume_from, fmt, schema)
            resumed = plan.said
        job.check()
        record = None
        if errors_path is not None:  # before anything is sent: a killed run says so
            record = (
                errors_path,
                RunRecord.start(
                    identity, dry_run=dry_run, resumed_from=resume_from, errors_format=errors_format
                ),
            )
            write_record(spark, *record)
        try:
            ran = job.run(
                selected,
                errors_path=errors_path,
                progress=progress,
                summarise=lambda partial, written: summary_of(
                    partial, written, dry_run=dry_run, resumed=resumed
                ),
                span=span,
                resumable=errors_path is not None or resume_from is not None,
                skip=skip,
            )
        except SparkJobFailed as exc:
            if record is not None and exc.summary is not None and exc.summary.errors_path:
                failed = record[1].ended_as(
                    "failed",
                    unconfirmed=exc.summary.total_unconfirmed,
                    unfinished=exc.summary.unfinished,
                )
                write_record(spark, record[0], failed)
            raise
        summary = summary_of(ran, errors_path, dry_run=dry_run, resumed=resumed)
        if record is not None:
            complete = record[1].ended_as("complete", unconfirmed=summary.total_unconfirmed)
            write_record(spark, record[0], complete)
        if span is not None:
            span.summary(summary)
        if ran.got.unconfirmed or ran.got.failures:
            raise unconfirmed_error(summary, ran.got.failures, job.policy)
        if limit.exceeded(rejected=summary.total_rejected, rows=summary.rows):
            raise summary.rejected_error(limit)
    return summary


def summary_of(
    ran: Ran, errors_path: str | None, *, dry_run: bool = False, resumed: str = ""
) -> ScheduleSummary:
    """The summary of one run (a job, or a micro-batch of a stream)."""
    got = ran.got
    return ScheduleSummary(
        published=dict(got.published),
        rejected=dict(got.rejected),
        errors=dict(got.errors),
        errors_path=errors_path,
        rejections=got.rejections,
        duplicate_in_input=ran.duplicate_in_input,
        dry_run=dry_run,
        unconfirmed=dict(got.unconfirmed),
        retried=got.retried,
        rerun=got.rerun,
        unfinished=ran.unfinished,
        resumed=resumed,
        skipped=got.skipped,
    )
