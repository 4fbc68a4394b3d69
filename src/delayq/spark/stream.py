"""Scheduling from a Structured Streaming source: each micro-batch is one scheduling run.

:func:`schedule_stream` starts a query whose ``foreachBatch`` runs exactly what
:func:`delayq.spark.schedule` runs for a DataFrame (:mod:`delayq.spark._run`) on each
micro-batch: the same columns, repeated-key handling, per-partition publishing through
broker outages (``retry_for``, ``backoff``) and errors output, one folder per batch
(``errors_path/batch=<id>``).

What is guaranteed:

* **At-least-once publishing.** Spark commits a batch to the checkpoint only after its
  ``foreachBatch`` returned. A batch with rows the broker did not confirm raises
  :class:`~delayq.errors.RowsUnconfirmed`: the query stops, the batch is not committed,
  and a restart with the same checkpoint runs it again. A process killed mid-batch is
  the same: the restart re-runs the batch it was in.
* **Exactly-once handling**, with idempotent consumers: message ids derive from the key,
  so the rows a re-run batch sends again are duplicates with the ids of the first
  sending, which a consumer with an idempotency store skips.
* A key is one message id across batches too: a key seen again in a later batch is a
  duplicate to the consumers, not a new message (repeated keys within one batch are
  handled by ``duplicates`` as in a batch job).

Rejected rows never stop the query: each batch writes its own to the errors output.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from delayq.durations import format_ms, to_ms
from delayq.errors import DelayqError, InvalidInput, RowsUnconfirmed
from delayq.spark._resilient import RetryPolicy
from delayq.spark._run import Job
from delayq.spark._tracing import ProviderFactory, job_span
from delayq.spark.schedule import ScheduleSummary, summary_of
from delayq.topology.model import Topology
from delayq.urls import check_vhost, resolve_url

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = [
    "AVAILABLE_NOW",
    "BatchSummary",
    "ScheduleStream",
    "describe_trigger",
    "schedule_stream",
    "trigger_options",
]

AVAILABLE_NOW = "available-now"
"""The trigger that processes what the source holds at the start, then stops the query."""


@dataclass(frozen=True)
class BatchSummary:
    """One micro-batch's run: its id and its :class:`~delayq.spark.ScheduleSummary`."""

    batch_id: int
    summary: ScheduleSummary

    def line(self) -> str:
        """``batch 3: 120 rows, 118 published, 2 rejected, 0 duplicate-in-input``."""
        s = self.summary
        text = (
            f"batch {self.batch_id}: {s.rows:,} rows, {s.total_published:,} published, "
            f"{s.total_rejected:,} rejected, {s.duplicate_in_input:,} duplicate-in-input"
        )
        if s.retried:
            text += f", {s.retried:,} sent again after a lost connection"
        if s.total_rejected and s.errors_path:
            text += f" (rejections in {s.errors_path})"
        return text


@dataclass
class _Record:
    """What the batches did, kept by the query's thread, read by the caller's."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    batches: list[BatchSummary] = field(default_factory=list)
    error: DelayqError | None = None
    running: threading.Lock = field(default_factory=threading.Lock)
    """Held while a batch runs: :meth:`ScheduleStream.stop` waits for it."""
    stopping: bool = False
    """:meth:`ScheduleStream.stop` was called: a batch starting now sends nothing."""


class _Stopping(Exception):
    """A batch that started after :meth:`ScheduleStream.stop`: refused before it sent
    anything, so Spark does not commit it and a restart runs it."""


class ScheduleStream:
    """A running :func:`schedule_stream` query: the Spark ``StreamingQuery`` and what its
    batches did."""

    def __init__(self, query: StreamingQuery, record: _Record) -> None:
        self.query = query
        self._record = record

    @property
    def batches(self) -> list[BatchSummary]:
        """Each batch this query ran, in order (a batch re-run after a restart is in the
        new query's)."""
        with self._record.lock:
            return list(self._record.batches)

    @property
    def error(self) -> DelayqError | None:
        """The delayq error that failed a batch (and so stopped the query), if one did."""
        with self._record.lock:
            return self._record.error

    @property
    def is_active(self) -> bool:
        return bool(self.query.isActive)

    def stop(self, *, finish_batch_s: float = 30.0) -> None:
        """Stop the query once the batch running now (if any) is done, waiting for it up
        to ``finish_batch_s``. A batch that starts meanwhile sends nothing; one stopped
        mid-way (past ``finish_batch_s``) is not committed: a restart runs it again
        (duplicates, for what it had published). Neither counts as the query's error."""
        record = self._record
        with record.lock:
            record.stopping = True
        if record.running.acquire(timeout=max(finish_batch_s, 0.0)):
            record.running.release()
        self.query.stop()

    def await_termination(self, timeout_s: float | None = None) -> bool:
        """Wait until the query ends (``True``), or ``timeout_s`` (``False``). A query
        that failed raises its delayq error (a failed batch's
        :class:`~delayq.errors.RowsUnconfirmed`, a ``ConnectionFailed``...), or
        :class:`~delayq.errors.DelayqError` with Spark's first line for another cause."""
        try:
            if timeout_s is None:
                self.query.awaitTermination()
                ended = True
            else:
                wait: Any = max(timeout_s, 0.001)  # seconds; PySpark takes a float too
                ended = bool(self.query.awaitTermination(wait))
        except Exception as exc:  # StreamingQueryException: a batch raised
            if self.error is None and self._record.stopping:
                return True  # a batch refused or cut by stop(): not committed, no failure
            raise self._failure(exc) from exc
        if ended:
            self._raise_failure()
        return ended

    def _raise_failure(self) -> None:
        failed = self.query.exception()
        if failed is not None and (self.error is not None or not self._record.stopping):
            raise self._failure(failed)

    def _failure(self, exc: BaseException) -> DelayqError:
        error = self.error
        if error is not None:
            return error
        from delayq.spark._checks import task_error

        found = task_error(exc, note=" (the streaming query stopped)")
        if found is not None:
            return found
        text = str(exc).strip()
        first = text.splitlines()[0] if text else type(exc).__name__
        return DelayqError(f"the streaming query failed: {first}")


def trigger_options(trigger: object) -> dict[str, Any]:
    """``DataStreamWriter.trigger``'s keywords for ``trigger``."""
    if trigger is None:
        return {}
    if trigger == AVAILABLE_NOW:
        return {"availableNow": True}
    if isinstance(trigger, bool):
        raise InvalidInput(f"trigger must be a duration or {AVAILABLE_NOW!r}, not {trigger!r}")
    try:
        every_ms = to_ms(trigger, what="trigger")
    except InvalidInput as exc:
        raise InvalidInput(
            f"{exc} (trigger: how often a micro-batch starts, e.g. '10s', or "
            f"{AVAILABLE_NOW!r} to process what is there and stop)"
        ) from exc
    if every_ms < 1:
        raise InvalidInput(f"trigger must be at least 1ms, got {trigger!r}")
    return {"processingTime": f"{every_ms} milliseconds"}


def schedule_stream(
    df: DataFrame,
    *,
    url: str | None = None,
    topology: Topology,
    checkpoint: str,
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
    duplicates: str = "reject",
    id_col: str | None = None,
    retry_for: object = "60s",
    backoff: object = "200ms",
    trigger: object = None,
    query_name: str | None = None,
    on_batch: Callable[[BatchSummary], None] | None = None,
    tracing: ProviderFactory | Literal[False] | None = None,
    schedule_index: str | None = None,
) -> ScheduleStream:
    """Start a streaming query publishing one delayed message per row of ``df`` (a
    streaming DataFrame: ``spark.readStream...``); return it, started.

    Columns and settings are :func:`delayq.spark.schedule`'s, applied to each
    micro-batch. ``checkpoint`` (required; shared storage on a cluster) is where Spark
    keeps the query's progress: a query restarted with it carries on after the last
    committed batch, and runs again a batch that was not committed. ``errors_path``
    gets one folder per batch, ``errors_path/batch=<id>`` (``errors_format``); without
    it the rejections are in each :class:`BatchSummary`. ``trigger``: a duration
    (``"10s"``: a batch at most that often), :data:`AVAILABLE_NOW` (what the source
    holds now, then the query stops), or ``None`` (Spark's default: the next batch as
    soon as the last is done). ``on_batch`` is called with each batch's
    :class:`BatchSummary`, on the driver.

    A batch left with unconfirmed rows (the broker silent for ``retry_for``) raises
    :class:`~delayq.errors.RowsUnconfirmed`: the query stops without committing it,
    and a restart sends it again (duplicates for the rows that were confirmed). The
    broker and the topology are checked before the query starts, as by ``schedule``.
    ``tracing`` and ``schedule_index`` are ``schedule``'s: each batch is a trace of its
    own, a ``schedule <namespace>`` span (``delayq.batch_id``) with its messages' ``publish`` spans.
    """
    url = resolve_url(url)
    check_vhost(topology.declared_vhost, url)
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
        retry_for=retry_for,
        backoff=backoff,
        tracing=tracing,
        schedule_index=schedule_index,
    )
    if not df.isStreaming:
        raise InvalidInput(
            "df is not a streaming DataFrame: schedule it with delayq.spark.schedule "
            "(delayq spark schedule); schedule_stream takes spark.readStream's"
        )
    if not checkpoint or not isinstance(checkpoint, str):
        raise InvalidInput(
            "schedule_stream needs a checkpoint (a directory, shared storage on a "
            "cluster): without one a restarted query would lose or re-send batches"
        )
    triggered = trigger_options(trigger)
    job.select(df)  # the columns checked now; each batch takes them itself
    job.check()
    record = _Record()

    def run_batch(batch: DataFrame, batch_id: int) -> None:
        with record.running:
            if record.stopping:
                raise _Stopping(f"batch {batch_id} started as the query was being stopped")
            _run_batch(batch, batch_id)

    def _run_batch(batch: DataFrame, batch_id: int) -> None:
        where = f"{errors_path.rstrip('/')}/batch={batch_id}" if errors_path else None
        try:
            with job_span(job.tracing, topology.namespace, {"delayq.batch_id": batch_id}) as span:
                selected = job.select(batch)
                ran = job.run(selected, errors_path=where, summarise=summary_of, span=span)
                summary = summary_of(ran, where)
                if span is not None:
                    span.summary(summary)
                if ran.got.unconfirmed or ran.got.failures:
                    raise _not_committed(batch_id, summary, ran.got.failures, job.policy)
        except DelayqError as exc:
            with record.lock:
                if not record.stopping:  # stopped mid-way: not committed, not a failure
                    record.error = exc
            raise
        done = BatchSummary(batch_id, summary)
        with record.lock:
            record.batches.append(done)
        if on_batch is not None:
            on_batch(done)

    writer = df.writeStream.foreachBatch(run_batch).option("checkpointLocation", checkpoint)
    if query_name is not None:
        writer = writer.queryName(query_name)
    if triggered:
        writer = writer.trigger(**triggered)
    try:
        query = writer.start()
    except Exception as exc:  # AnalysisException: an unsupported source, a bad checkpoint
        text = str(exc).strip()
        first = text.splitlines()[0] if text else type(exc).__name__
        raise InvalidInput(f"cannot start the streaming query: {first}") from exc
    return ScheduleStream(query, record)


def _not_committed(
    batch_id: int, summary: ScheduleSummary, failures: list[Any], policy: RetryPolicy
) -> RowsUnconfirmed:
    """The error of a batch left with unconfirmed rows: the query stops without it."""
    causes = sorted({str(reason).removeprefix("unconfirmed: ") for _, reason in failures})
    cause = "; ".join(causes) or f"no confirm within retry_for={format_ms(policy.retry_for_ms)}"
    where = f" ({summary.errors_path} names them)" if summary.errors_path else ""
    return RowsUnconfirmed(
        f"batch {batch_id} was not committed: {summary.total_unconfirmed:,} of "
        f"{summary.rows:,} rows were not confirmed by the broker ({cause}){where}; "
        f"{summary.total_published:,} were published, {summary.total_rejected:,} rejected. "
        "The query stopped: restart it with the same checkpoint to run the batch again "
        "(what was published is sent again as duplicates, which idempotent consumers "
        "skip); a longer outage needs a longer retry_for (--retry-for)",
        summary,
    )


def describe_trigger(trigger: object) -> str:
    """How a trigger reads in a progress line: ``every 10s``, ``available now``..."""
    if trigger is None:
        return "as soon as data arrives"
    if trigger == AVAILABLE_NOW:
        return "what is there now, then stop"
    return f"every {format_ms(to_ms(trigger))}"
