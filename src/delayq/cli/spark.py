"""``delayq spark schedule | cancel | report``: the Spark jobs (extra ``delayq[spark]``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from delayq.cli._common import (
    EXIT_BROKER,
    EXIT_OK,
    Args,
    load_cli_topology,
    topology_and_url,
)
from delayq.cli._console import progress_bar
from delayq.cli.spark_inputs import CSV_OPTIONS, check_source, read_source, rows_progress
from delayq.durations import format_ms, to_ms
from delayq.errors import InvalidInput
from delayq.urls import redact
from delayq.wording import counted


def _spark_session(args: Args) -> Any:
    from delayq.cli.spark_cluster import prepare_session
    from delayq.spark import local_session

    session = local_session(
        args.master, app_name=f"delayq spark {args.spark_command}", ui=False if args.no_ui else None
    )
    session.sparkContext.setLogLevel("ERROR")
    prepare_session(session, args)
    return session


def _check_input(args: Args) -> None:
    if "://" not in args.input and not Path(args.input).exists():  # before Spark starts
        raise InvalidInput(f"no input at {args.input}: no such file or directory")


def _read_input(session: Any, args: Args) -> tuple[Any, str]:
    """INPUT as a DataFrame (its format from ``--format`` or its extension), and the format."""
    fmt = args.format or {".parquet": "parquet", ".csv": "csv"}.get(
        Path(args.input).suffix, "jsonl"
    )
    reader = session.read
    if fmt == "csv":
        reader = reader.options(**CSV_OPTIONS)
    try:
        df = reader.format("json" if fmt == "jsonl" else fmt).load(args.input)
    except Exception as exc:  # Spark's AnalysisException: not a traceback for a bad file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InvalidInput(f"cannot read {args.input} as {fmt}: {first}") from exc
    return df, fmt


def run_settings(args: Args) -> dict[str, Any]:
    """The settings ``delayq spark schedule`` and ``stream`` give each run, from their
    shared options (see :class:`delayq.spark._run.Job`)."""
    return {
        "key_col": args.key_col,
        "routing_key_col": args.routing_key_col,
        "delay_col": args.delay_col,
        "due_col": args.due_col,
        "body_col": None if args.body_col == "none" else args.body_col,
        "body_json": args.body_json,
        "errors_path": args.errors,
        "errors_format": args.errors_format,
        "partitions": args.partitions,
        "window": args.window,
        "duplicates": args.duplicates,
        "id_col": args.id_column,
        "retry_for": args.retry_for,
        "backoff": args.backoff,
        "schedule_index": args.schedule_index,
    }


def check_schedule_index(args: Args) -> None:
    """``--schedule-index`` opened (a new SQLite file made) before Spark starts: a wrong
    one is refused at once, named as given."""
    if args.schedule_index is not None and not getattr(args, "dry_run", False):
        from delayq.schedule.url import open_index

        open_index(args.schedule_index, create=True, what="--schedule-index").close()


def cmd_spark_schedule(args: Args) -> int:
    from delayq.errors import RowsRejected, RowsUnconfirmed, SparkJobFailed
    from delayq.message.bulk import RejectionLimit
    from delayq.spark import schedule
    from delayq.spark._resilient import RetryPolicy

    max_rejected = None if args.allow_rejected else args.max_rejected
    RejectionLimit.parse(max_rejected)  # a bad value is refused before Spark starts
    RetryPolicy.parse(args.retry_for, args.backoff)  # so are bad durations
    topology, url = topology_and_url(args)
    check_source(args)
    check_schedule_index(args)
    session = _spark_session(args)
    df, source = read_source(session, args)
    print(
        f"{'checking (dry run)' if args.dry_run else 'scheduling'} {source} into namespace "
        f"{topology.namespace!r} on {redact(url)}",
        file=sys.stderr,
    )

    failure: RowsRejected | RowsUnconfirmed | SparkJobFailed | None = None
    with rows_progress("checking" if args.dry_run else "publishing") as progress:
        try:
            summary = schedule(
                df,
                url=url,
                topology=topology,
                progress=progress,
                max_rejected=max_rejected,
                dry_run=args.dry_run,
                resume_from=args.resume,
                **run_settings(args),
            )
        except (RowsRejected, RowsUnconfirmed, SparkJobFailed) as exc:  # summary, then error
            failure, summary = exc, exc.summary
    if args.json:
        print(json.dumps({k: v for k, v in summary.__dict__.items()}, default=str))
    else:
        sys.stdout.write(summary.render())
        for rejection in summary.rejections[:50]:
            print(f"rejected {rejection['key']!r}: {rejection['error']}: {rejection['reason']}")
        if len(summary.rejections) > 50:
            print(f"... and {len(summary.rejections) - 50} more (use --errors DIR)")
    if failure is not None:
        print(f"delayq: error: {failure}", file=sys.stderr)
        return EXIT_BROKER
    return EXIT_OK


def cmd_spark_cancel(args: Args) -> int:
    from delayq.errors import RowsRejected
    from delayq.message.bulk import RejectionLimit
    from delayq.spark.cancel import cancel_from_dataframe, check_store_url
    from delayq.stores.url import open_store

    max_rejected = None if args.allow_rejected else args.max_rejected
    RejectionLimit.parse(max_rejected)  # bad values are refused before Spark starts
    topology = load_cli_topology(args)
    store_url = check_store_url(args.store, what="--store")
    _check_input(args)
    open_store(store_url).close()  # an unreachable store fails before Spark starts
    session = _spark_session(args)
    df, fmt = _read_input(session, args)
    what = f"ids of column {args.id_col!r}" if args.id_col else f"keys of column {args.key_col!r}"
    print(
        f"cancelling the {what} of {args.input} ({fmt}) in namespace "
        f"{topology.namespace!r}; store {redact(store_url)}",
        file=sys.stderr,
    )
    failure: RowsRejected | None = None
    with progress_bar("cancelling (Spark tasks done)") as progress:
        try:
            summary = cancel_from_dataframe(
                df,
                topology,
                store_url,
                id_column=args.id_col,
                key_column=args.key_col,
                routing_key_column=args.routing_key_col,
                key_scope=args.key_scope,
                queues=args.queues or None,
                errors_path=args.errors,
                errors_format=args.errors_format,
                partitions=args.partitions,
                progress=progress,
                max_rejected=max_rejected,
            )
        except RowsRejected as exc:  # the summary is still the job's outcome: print it first
            failure, summary = exc, exc.summary
    if args.json:
        print(json.dumps(summary.to_json(), default=str))
    else:
        sys.stdout.write(summary.render())
        for rejection in summary.rejections[:50]:
            name = rejection["message_id"] if summary.by == "message_ids" else rejection["key"]
            print(f"rejected {name!r}: {rejection['error']}: {rejection['reason']}")
        if len(summary.rejections) > 50:
            print(f"... and {len(summary.rejections) - 50} more (use --errors DIR)")
    if summary.not_cancelled:
        print(
            f"delayq: warning: {counted(summary.not_cancelled, 'message')} "
            f"{'was' if summary.not_cancelled == 1 else 'were'} NOT cancelled: the "
            "cancel came too late (in progress: a handler is running; already handled: "
            "done) or met a newer reschedule (outdated)",
            file=sys.stderr,
        )
    if failure is not None:
        print(f"delayq: error: {failure}", file=sys.stderr)
        return EXIT_BROKER
    return EXIT_OK


def _current_ladder(args: Args) -> tuple[Any, str]:
    """The current ladder and where it came from: ``--ladder``, else the topology file
    (``--file``, or the default one when it exists), else none (the records' tiers)."""
    from delayq.topology.ladder import Ladder
    from delayq.topology.model import DEFAULT_TOPOLOGY_FILE

    if args.ladder:
        return Ladder.parse(args.ladder.split()), "--ladder"
    if Path(args.file) == DEFAULT_TOPOLOGY_FILE and not Path(args.file).exists():
        return None, ""
    return load_cli_topology(args).ladder, f"the topology file {args.file}"


def _check_report_paths(records: str, out: Path) -> None:
    """What :func:`delayq.spark.report` checks of its paths, checked before the session
    starts, and ``out`` made: a bad path costs no Spark start, and is no traceback."""
    if "://" not in records and not Path(records).exists():  # local, not hdfs:// etc.
        raise InvalidInput(f"no delivery records at {records}: no such file or directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise InvalidInput(
            f"cannot write the report to {out}: it is a file, not a directory"
        ) from None
    except OSError as exc:  # a name too long, a file on the way, a read-only place
        raise InvalidInput(f"cannot write the report to {out}: {exc.strerror or exc}") from exc


def cmd_spark_report(args: Args) -> int:
    from delayq.spark import report
    from delayq.topology.fit import DEFAULT_GRID_MS

    ladder, source = _current_ladder(args)
    grid = tuple(to_ms(g, what="--grid value") for g in args.grid.split()) if args.grid else None
    if args.grid is not None and not grid:
        raise InvalidInput('--grid needs at least one duration, e.g. "30s 1m 5m 1h 24h"')
    bucket_ms = to_ms(args.bucket, what="--bucket") if args.bucket else None
    _check_report_paths(args.records, args.out)  # before Spark takes its seconds to start
    session = _spark_session(args)
    summary = report(
        args.records,
        args.out,
        spark=session,
        ladder=ladder,
        ladder_from=source,
        max_tiers=args.max_tiers,
        bucket_ms=bucket_ms,
        grid_ms=grid or DEFAULT_GRID_MS,
        objective=args.objective,
    )
    print(
        f"{summary.records:,} records ({summary.skipped:,} skipped); wrote "
        f"{', '.join(str(args.out / f) for f in summary.files)}"
    )
    if summary.skipped:
        print(
            f"delayq: warning: {summary.skipped:,} lines of {args.records} were skipped "
            "(malformed, or another record version): the report leaves them out",
            file=sys.stderr,
        )
    if summary.current_from:
        print(f"the current ladder is from {summary.current_from}")
    for fit, label in ((summary.current, "current"), (summary.recommended, "recommended")):
        if fit is not None:
            print(
                f"{label:>12} ladder: {' '.join(format_ms(t) for t in fit.tiers_ms)} "
                f"(mean relative overshoot {fit.mean_relative_overshoot:.1%}; tier / delay "
                f"p99 {fit.p99_ratio:.2f}x, max {fit.max_ratio:.2f}x; "
                f"{fit.over_2x:.1%} wait over 2x)"
            )
    if summary.not_recommended:
        print(f"delayq: warning: no ladder recommended: {summary.not_recommended}", file=sys.stderr)
    return EXIT_OK
