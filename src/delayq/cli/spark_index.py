"""``delayq spark forecast | export``: the schedule index as a Spark DataFrame
(:mod:`delayq.spark.index`): deliveries due per minute ahead, and the index written as
Parquet."""

from __future__ import annotations

import csv
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from delayq.cli._common import EXIT_OK, Args, load_cli_topology, print_json
from delayq.cli._console import show_table
from delayq.cli.options import Command, flag, json_flag, leaf, once
from delayq.cli.params import PathParam
from delayq.cli.scheduled_args import filters, index_option, open_index, query_of
from delayq.cli.spark_cluster import session_options
from delayq.durations import format_ms
from delayq.errors import InvalidInput
from delayq.tables import Column, Table

if TYPE_CHECKING:
    from delayq.topology.fit import LadderFit

__all__ = ["index_commands"]


def index_commands() -> list[Command]:
    return [
        leaf(
            "forecast",
            "delayq.cli.spark_index:cmd_forecast",
            "deliveries due each minute of the next 24 hours, and the waiting messages by "
            "tier and due window, from a schedule index",
            [
                *filters(),
                *session_options(),
                once("--horizon", default="24h", metavar="DURATION", help="default 24h"),
                once("--bucket", default="1m", metavar="DURATION", help="default 1m"),
                once(
                    "--out",
                    type=PathParam(),
                    metavar="FILE",
                    help="write every bucket as CSV (start, start_ms, due)",
                ),
                json_flag("print the buckets and the histogram as JSON"),
            ],
            url=False,
            file=True,
            names={"spark_command": "forecast"},
        ),
        leaf(
            "export",
            "delayq.cli.spark_index:cmd_export",
            "write a schedule index's entries as Parquet (a new folder OUT), through Spark",
            [
                click.Argument(["out"], metavar="OUT"),
                *filters(),
                *session_options(),
                flag(
                    "--bodies",
                    help="with the bodies the index kept (what delayq spark import sends again)",
                ),
            ],
            url=False,
            file=True,
            names={"spark_command": "export"},
        ),
        leaf(
            "import",
            "delayq.cli.spark_index:cmd_import",
            "publish the waiting messages of a Parquet export (delayq spark export --bodies) "
            "again, keeping their ids and due times",
            [
                click.Argument(["input"], metavar="INPUT"),
                index_option(required=False, what="record them in this index"),
                *session_options(),
                json_flag("print the counts as JSON"),
            ],
            url=True,
            file=True,
            names={"spark_command": "import"},
        ),
    ]


def _check_out(path: Path) -> None:
    """``--out`` a file that can be written: its folder there, itself not a folder."""
    if path.is_dir():
        raise InvalidInput(f"--out {path} is a folder: give a file name (forecast.csv)")
    if not path.parent.is_dir():
        raise InvalidInput(f"--out {path}: no folder {path.parent}")


def _check_parquet(path: Path) -> None:
    """An export's local path holds Parquet: a file of it, or a folder with some."""
    if not path.exists():
        raise InvalidInput(f"no export at {path}: no such file or directory")
    files = [path] if path.is_file() else sorted(path.rglob("*.parquet"))
    if not files:
        raise InvalidInput(f"{path} holds no Parquet files: not an export (delayq spark export)")
    with files[0].open("rb") as first:
        if first.read(4) != b"PAR1":
            raise InvalidInput(f"{files[0]} is not a Parquet file: not an export")


def _target_index(url: str) -> Any:
    """``--index`` opened if it is there (its ids already scheduled are skipped), else
    ``None``: made once the import sends, not by a run refused before."""
    from delayq.schedule.url import sqlite_path

    path = sqlite_path(url)
    if path is None or "://" in path or Path(path).exists():
        return open_index(url, what="--index")
    if not Path(path).parent.is_dir():
        raise InvalidInput(f"--index {url}: no folder {Path(path).parent} for a new index")
    return None


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _session(args: Args) -> Any:
    from delayq.cli.spark import _spark_session

    return _spark_session(args)


def cmd_forecast(args: Args) -> int:
    from delayq.message.envelope import epoch_ms
    from delayq.spark.index import (
        check_buckets,
        due_histogram,
        forecast,
        index_frame,
        ladder_advice,
        requested_delays,
    )

    _, bucket_ms = check_buckets(args.horizon, args.bucket)  # before Spark starts
    topology = load_cli_topology(args)
    query = query_of(args, topology.namespace)
    if args.out is not None:
        _check_out(Path(args.out))
    store = open_index(args.index)  # a wrong URL is said before Spark takes its seconds
    try:
        session = _session(args)
        now = epoch_ms()
        with index_frame(session, store, query=query) as df:
            buckets = [
                (r["start_ms"], r["due"])
                for r in forecast(
                    df, now_ms=now, horizon=args.horizon, bucket=args.bucket
                ).collect()
            ]
            histogram = [r.asDict() for r in due_histogram(df, now_ms=now).collect()]
            total = df.count()
            delays = requested_delays(df)
    finally:
        store.close()
    if args.out is not None:
        try:
            with Path(args.out).open("w", newline="") as out:
                writer = csv.writer(out)
                writer.writerow(["start", "start_ms", "due"])
                writer.writerows((_utc(start), start, due) for start, due in buckets)
        except OSError as exc:
            raise InvalidInput(f"cannot write --out {args.out}: {exc.strerror or exc}") from exc
    current, recommended, refused = ladder_advice(delays, topology.ladder)
    if args.json:
        print_json(
            {
                "now_ms": now,
                "entries": total,
                "buckets": [{"start_ms": s, "due": d} for s, d in buckets],
                "histogram": histogram,
                "ladder": {
                    "current": None if current is None else _fit(current),
                    "recommended": None if recommended is None else _fit(recommended),
                    "why_none": refused or None,
                },
            }
        )
        return EXIT_OK
    _print_forecast(args, total, buckets, histogram, bucket_ms)
    asked = sum(delays.values())
    if current is not None:
        print(f"\nthe ladder, for the delays {asked:,} waiting messages asked for:")
        print(f"     current: {_fit_line(current)}")
    if recommended is not None:
        print(f"  recommended: {_fit_line(recommended)}")
    elif refused:
        print(f"  no recommendation: {refused}")
    return EXIT_OK


def _fit(fit: LadderFit) -> dict[str, Any]:
    return {
        "tiers": [format_ms(t) for t in fit.tiers_ms],
        "mean_relative_overshoot": fit.mean_relative_overshoot,
        "p99_ratio": fit.p99_ratio,
        "too_long": fit.too_long,
    }


def _fit_line(fit: LadderFit) -> str:
    return (
        f"{' '.join(format_ms(t) for t in fit.tiers_ms)} (mean relative overshoot "
        f"{fit.mean_relative_overshoot:.1%}; tier / delay p99 {fit.p99_ratio:.2f}x"
        + (f"; {fit.too_long:,} longer than its top" if fit.too_long else "")
        + ")"
    )


def _print_forecast(
    args: Args,
    total: int,
    buckets: list[tuple[int, int]],
    histogram: list[dict[str, Any]],
    bucket_ms: int,
) -> None:
    ahead = sum(d for _, d in buckets)
    overdue = sum(h["due"] for h in histogram if h["window"] == "overdue")
    print(f"{total:,} entries read; {ahead:,} due in the next {args.horizon}; {overdue:,} overdue")
    if ahead:
        start, most = max(buckets, key=lambda b: b[1])
        print(f"busiest {args.bucket}: {most:,} due from {_utc(start)} UTC")
    per = max(1, 3_600_000 // bucket_ms)  # a row an hour (or a bucket, if longer)
    table = Table([Column("from (UTC)"), Column("due", right=True)])
    for i in range(0, len(buckets), per):
        table.add(_utc(buckets[i][0]), f"{sum(d for _, d in buckets[i : i + per]):,}")
    show_table(table)
    if histogram:
        print("\nwaiting, by tier and by how soon due:")
        by = Table([Column("tier"), Column("window"), Column("due", right=True)])
        for h in histogram:
            by.add(h["tier"] or "(none)", h["window"], f"{h['due']:,}")
        show_table(by)
    if args.out is not None:
        print(f"wrote {len(buckets):,} buckets to {args.out}", file=sys.stderr)


def cmd_export(args: Args) -> int:
    from delayq.spark.index import read_index

    query = query_of(args, load_cli_topology(args).namespace)
    if not args.out.strip():
        raise InvalidInput("OUT is empty: give a new folder to write the export to")
    if "://" not in args.out and Path(args.out).exists():
        raise InvalidInput(f"{args.out} exists: give a new folder")  # before Spark starts
    store = open_index(args.index)
    try:
        session = _session(args)

        def progress(done: int) -> None:
            print(f"exported {done:,} entries", file=sys.stderr)

        df = read_index(
            session, store, args.out, query=query, bodies=args.bodies, progress=progress
        )
        print(f"exported {df.count():,} entries to {args.out}")
    finally:
        store.close()
    return EXIT_OK


def cmd_import(args: Args) -> int:
    from itertools import islice

    from delayq.cli._common import topology_and_url
    from delayq.cli.scheduled_transfer import BATCH, check_free, imported, republish, said_done
    from delayq.message.envelope import epoch_ms
    from delayq.schedule.transfer import IMPORTED, Sendable, importable
    from delayq.spark.index import entries_of, read_export

    topology, url = topology_and_url(args)
    if "://" not in args.input:  # before Spark starts
        _check_parquet(Path(args.input))
    # An index that is there is read for what it holds; a new one is made only to send.
    index = None if args.index is None else _target_index(args.index)
    try:
        df = read_export(_session(args), args.input)
        sendable, now = Sendable(topology), epoch_ms()
        total, bodies, left, first = 0, 0, 0, None
        done: set[str] = set()
        for entry in entries_of(df):  # every row checked before anything is sent
            todo, passed = importable([entry])
            for each in todo:
                sendable.check(each, now)
                bodies += each.body is not None
            if todo and index is not None:
                done.update(check_free(index, todo, topology.namespace))
            total += len(todo)
            left += len(passed)
            first = first or (passed[0] if passed else None)
        if total and not bodies:
            raise InvalidInput(
                f"none of the {total:,} waiting entries of {args.input} has its body: it was "
                "exported without --bodies (delayq spark export --bodies); nothing was sent"
            )
        if first is not None:
            print(
                f"delayq: skipping {left:,} entries of messages no longer waiting (first: "
                f"{first.id}, {first.state.value})",
                file=sys.stderr,
            )
        said_done(len(done))
        if index is None and args.index is not None:
            index = open_index(args.index, create=True)
        waiting = (e for e in entries_of(df) if e.state in IMPORTED and e.id not in done)
        batches = iter(lambda: list(islice(waiting, BATCH)), [])
        sent, not_kept = republish(url, topology, index, batches, total - len(done))
    finally:
        if index is not None:
            index.close()
    return imported(args, sent, not_kept, total - len(done), left)
