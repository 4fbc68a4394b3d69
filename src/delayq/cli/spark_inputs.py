"""``delayq spark schedule``'s input side: INPUT or ``--table``, ``--option`` for the Spark
reader, ``--resume`` and the outage options, and progress in rows with a rate and an ETA."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

import click

from delayq.cli._common import Args
from delayq.cli._console import is_terminal, throttled_lines
from delayq.cli.options import flag, once
from delayq.durations import format_ms
from delayq.errors import InvalidInput

__all__ = ["check_source", "read_source", "rows_progress", "schedule_input_options"]

FORMATS = {".parquet": "parquet", ".csv": "csv"}

CSV_OPTIONS = {"header": "true", "escape": '"', "multiLine": "true"}
"""How the commands read CSV, before any ``--option``: a header row; RFC 4180's quotes
(a quote inside a quoted cell doubled, as Python's csv module, pandas and Excel write
it, where Spark's default escape is a backslash); and quoted cells over several lines
(a body with a newline; Spark's default splits the row there, and a CRLF inside such a
cell arrives as LF)."""


def _reader_options(ctx: click.Context, param: click.Parameter, values: Sequence[str]) -> Any:
    options: dict[str, str] = {}
    for value in values:
        name, eq, given = value.partition("=")
        if not eq or not name.strip():
            raise click.BadParameter(
                f"{value!r} is not KEY=VALUE (e.g. --option escape='\"' or "
                "--option multiLine=true)",
                ctx,
                param,
            )
        options[name.strip()] = given
    return options


def schedule_input_options() -> list[click.Parameter]:
    """The options of ``delayq spark schedule`` for its input, its checks and outages."""
    return [
        once(
            "--table",
            metavar="NAME",
            help="read this table of the session's catalog (db.t, catalog.db.t, or "
            "parquet.`/path`) instead of INPUT",
        ),
        click.Option(
            ["--option", "reader_options"],
            multiple=True,
            metavar="KEY=VALUE",
            callback=_reader_options,
            help="passed to the Spark reader; repeatable (CSV is read with header=true, "
            "escape='\"' and multiLine=true unless given here)",
        ),
        once(
            "--id-column",
            "id_column",
            metavar="C",
            help="an input column written beside each rejected row in the errors output",
        ),
        once(
            "--duplicates",
            type=click.Choice(["reject", "keep-last"]),
            default="reject",
            help="rows sharing a key: reject every one of them (default), or publish "
            "only the last in input order",
        ),
        flag(
            "--dry-run",
            help="read and check every row, print the plan and the rejections; publish "
            "nothing (exit code as a real run)",
        ),
        once(
            "--retry-for",
            default="60s",
            metavar="DURATION",
            help="how long a partition waits out a broker that confirms nothing, "
            "reconnecting and sending again what was unconfirmed (default 60s)",
        ),
        once(
            "--backoff",
            default="200ms",
            metavar="DURATION",
            help="the first pause between reconnects, doubled up to 5s (default 200ms)",
        ),
        once(
            "--schedule-index",
            metavar="URL",
            help="record every message in this schedule index (a SQLite file on this "
            "machine's executors only; postgresql://, redis:// for a cluster), as delayq "
            "scheduled reads it",
        ),
        once(
            "--resume",
            metavar="DIR",
            help="resume the run whose errors output (--errors DIR) this is: just its "
            "unconfirmed rows, or every row if that run never finished; refused for "
            "another input or a run with nothing unconfirmed",
        ),
    ]


def check_source(args: Args) -> None:
    """INPUT or ``--table``, exactly one; INPUT exists (before Spark starts)."""
    if args.input is not None and args.table is not None:
        raise InvalidInput("give INPUT or --table, not both")
    if args.input is None and args.table is None:
        raise InvalidInput("give INPUT (a file or directory) or --table NAME")
    if args.table is not None and args.format is not None:
        raise InvalidInput("--format is for INPUT; a --table has its own format")
    if args.input is not None and "://" not in args.input and not Path(args.input).exists():
        raise InvalidInput(f"no input at {args.input}: no such file or directory")


def read_source(session: Any, args: Args) -> tuple[Any, str]:
    """The DataFrame to schedule, and how to name it (``PATH (format)`` or ``table T``)."""
    options: dict[str, str] = args.reader_options
    if args.table is not None:
        if options:
            raise InvalidInput("--option is for INPUT's reader; a --table is read as is")
        try:
            return session.table(args.table), f"table {args.table}"
        except Exception as exc:  # AnalysisException: TABLE_OR_VIEW_NOT_FOUND and the like
            raise InvalidInput(
                f"cannot read table {args.table!r} from the session's catalog: {_first(exc)}"
            ) from exc
    fmt = args.format or FORMATS.get(Path(args.input).suffix, "jsonl")
    reader = session.read
    if fmt == "csv":
        reader = reader.options(**CSV_OPTIONS)
    reader = reader.options(**options)
    try:
        df = reader.format("json" if fmt == "jsonl" else fmt).load(args.input)
    except Exception as exc:  # Spark's AnalysisException: not a traceback for a bad file
        raise InvalidInput(f"cannot read {args.input} as {fmt}: {_first(exc)}") from exc
    return df, f"{args.input} ({fmt})"


def _first(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@contextmanager
def rows_progress(
    label: str, stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic
) -> Iterator[Callable[[int, int], None]]:
    """A ``progress(rows done, rows in all)`` callback: a rich bar with the rate and the
    time left on a terminal; elsewhere ``LABEL: 1,200/10,000 rows (12%), 850 rows/s,
    ETA 10s`` at most once a second, and the last one."""
    out = sys.stderr if stream is None else stream
    if is_terminal(out):
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            ProgressColumn,
            Task,
            TimeRemainingColumn,
        )
        from rich.progress import Progress as RichProgress
        from rich.text import Text

        class Rate(ProgressColumn):
            def render(self, task: Task) -> Text:
                return Text(f"rows, {task.speed or 0:,.0f} rows/s, ETA")

        with RichProgress(
            f"[bold]{label}",
            BarColumn(),
            MofNCompleteColumn(),
            Rate(),
            TimeRemainingColumn(),
            console=Console(file=out),
            transient=False,
        ) as bar:
            task = bar.add_task(label, total=None)
            yield lambda done, total: bar.update(task, completed=done, total=total)
        return
    started = clock()

    def say(done: int, total: int, now: float) -> str:
        return progress_line(label, done, total, now - started)

    with throttled_lines(say, out, clock) as line:
        yield line


def progress_line(label: str, done: int, total: int, elapsed_s: float) -> str:
    """``LABEL: DONE/TOTAL rows (P%), R rows/s, ETA T`` (no rate before the first rows).

    >>> progress_line("publishing", 2_500, 10_000, 2.0)
    'publishing: 2,500/10,000 rows (25%), 1,250 rows/s, ETA 6s'
    """
    text = f"{label}: {done:,}/{total:,} rows"
    if total:
        text += f" ({done * 100 // total}%)"
    if done and elapsed_s > 0:
        rate = done / elapsed_s
        text += f", {rate:,.0f} rows/s"
        if done < total:
            left_s = max(1, round((total - done) / rate))  # whole seconds
            text += f", ETA {format_ms(left_s * 1000)}"
    return text
