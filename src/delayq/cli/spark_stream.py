"""``delayq spark stream``: schedule the rows of files dropped into a folder, as they come
(Structured Streaming; :func:`delayq.spark.schedule_stream`).

The column, topology and outage options are ``delayq spark schedule``'s own
declarations, taken from that command (:func:`stream_command`); the stream adds its
source (``--input DIR --format --schema``), ``--checkpoint``, and the trigger. One line
per batch on stdout; SIGINT or SIGTERM stop the query (exit 0); a failed query prints one
``delayq: error:`` line (exit 1).
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from typing import Any

import click

from delayq.cli._common import EXIT_OK, Args, topology_and_url
from delayq.cli.options import Command, flag, leaf, once
from delayq.cli.spark_inputs import CSV_OPTIONS
from delayq.errors import InvalidInput

__all__ = ["SHARED", "cmd_spark_stream", "stream_command"]

SHARED = (
    "key_col",
    "routing_key_col",
    "delay_col",
    "due_col",
    "body_col",
    "body_json",
    "errors_format",
    "partitions",
    "window",
    "reader_options",
    "id_column",
    "duplicates",
    "retry_for",
    "backoff",
    "schedule_index",
)
"""The options of ``delayq spark schedule`` the stream takes as they are."""

FORMATS = ("csv", "json", "parquet")


def stream_command(schedule: click.Command, session: list[click.Option]) -> Command:
    """``delayq spark stream``, its shared options taken from ``schedule``'s."""
    shared = {p.name: p for p in schedule.params if p.name in SHARED}
    missing = [name for name in SHARED if name not in shared]
    if missing:  # a renamed option of delayq spark schedule: say so at build time
        raise RuntimeError(f"delayq spark schedule has no option {', '.join(missing)}")
    return leaf(
        "stream",
        cmd_spark_stream,
        "schedule the rows of the files arriving in a folder as they come (Structured "
        "Streaming; one line per batch; runs until SIGINT/SIGTERM)",
        [
            once("--input", required=True, metavar="DIR", help="the folder to watch"),
            once(
                "--format",
                type=click.Choice(FORMATS),
                required=True,
                help="the files' format (csv with a header row)",
            ),
            once(
                "--schema",
                metavar="DDL",
                help="the files' columns, e.g. \"key string, routing_key string, delay "
                'string, body string" (required for csv and json)',
            ),
            once(
                "--checkpoint",
                required=True,
                metavar="DIR",
                help="the query's progress (shared storage on a cluster): a restart with "
                "it carries on where it stopped",
            ),
            once(
                "--errors",
                metavar="DIR",
                help="write each batch's rejected rows to DIR/batch=<id> (default: print them)",
            ),
            once(
                "--trigger",
                metavar="DURATION",
                help="start a batch at most this often, e.g. 10s (default: as soon as the "
                "last one is done)",
            ),
            flag("--available-now", help="process the files there now, then exit"),
            *session,
            *(shared[name] for name in SHARED),
        ],
        url=True,
        file=True,
        names={"spark_command": "stream"},
        one_of=[("delay_col", "due_col")],
        exclusive=[("trigger", "available_now")],
    )


def _stream_frame(session: Any, args: Args) -> Any:
    from delayq.cli.spark_inputs import _first

    reader = session.readStream
    if args.schema:
        reader = reader.schema(args.schema)
    elif args.format != "parquet":
        raise InvalidInput(
            f"--schema is required for a {args.format} stream (Spark does not infer a "
            'streaming schema), e.g. --schema "key string, routing_key string, delay '
            'string, body string"'
        )
    if args.format == "csv":
        reader = reader.options(**CSV_OPTIONS)
    reader = reader.options(**args.reader_options)
    try:
        return reader.format(args.format).load(args.input)
    except Exception as exc:  # AnalysisException: a bad schema, no schema for parquet
        raise InvalidInput(
            f"cannot read {args.input} as a {args.format} stream: {_first(exc)}"
        ) from exc


def cmd_spark_stream(args: Args) -> int:
    from delayq.cli.spark import _spark_session, check_schedule_index, run_settings
    from delayq.spark import BatchSummary, schedule_stream
    from delayq.spark._resilient import RetryPolicy
    from delayq.spark.stream import AVAILABLE_NOW, describe_trigger, trigger_options

    trigger = AVAILABLE_NOW if args.available_now else args.trigger
    trigger_options(trigger)  # a bad trigger is refused before Spark starts
    RetryPolicy.parse(args.retry_for, args.backoff)
    topology, url = topology_and_url(args)
    if "://" not in args.input and not Path(args.input).is_dir():
        raise InvalidInput(f"--input {args.input} is not a directory (the folder to watch)")
    check_schedule_index(args)
    session = _spark_session(args)
    # A failed query is said in one line below: not Spark's logged stack traces.
    session.sparkContext.setLogLevel("FATAL")
    df = _stream_frame(session, args)

    def said(batch: BatchSummary) -> None:
        print(batch.line(), flush=True)
        if batch.summary.errors_path is None:
            for rejection in batch.summary.rejections[:50]:
                print(
                    f"rejected {rejection['key']!r}: {rejection['error']}: {rejection['reason']}",
                    flush=True,
                )

    from delayq.urls import redact  # loads ssl: not for every --help

    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        stream = schedule_stream(
            df,
            url=url,
            topology=topology,
            checkpoint=args.checkpoint,
            trigger=trigger,
            on_batch=said,
            **run_settings(args),
        )
        print(
            f"streaming {args.input} ({args.format}) into namespace {topology.namespace!r} "
            f"on {redact(url)}: {describe_trigger(trigger)}; checkpoint {args.checkpoint}",
            file=sys.stderr,
            flush=True,
        )
        while not stop.is_set():
            if stream.await_termination(0.5):  # raises the delayq error of a failed query
                break
        if stop.is_set():
            print("stopping the query", file=sys.stderr, flush=True)
            stream.stop()
            stream.await_termination()
        batches = stream.batches
        print(
            f"stopped after {len(batches)} batch(es): "
            f"{sum(b.summary.total_published for b in batches):,} published, "
            f"{sum(b.summary.total_rejected for b in batches):,} rejected",
            file=sys.stderr,
        )
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return EXIT_OK
