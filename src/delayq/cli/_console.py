"""What the commands show a person: rich tables and progress bars on a terminal, plain
text everywhere else.

A pipe, a file or a test gets :meth:`delayq.tables.Table.plain` (aligned columns that
split on whitespace, no colour, no cell folded across lines) and progress as whole lines
at most once a second, so ``delayq dlq list | grep`` and a CI log read as before.
``NO_COLOR`` is honoured; ``TERM=dumb`` counts as no terminal.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

from delayq.tables import Table

__all__ = ["is_terminal", "progress_bar", "show_table", "throttled_lines"]

Progress = Callable[[int, int], None]
_STYLES = {"FAIL": "bold red", "OK": "green", "SKIPPED": "yellow", "missing": "bold red"}


def is_terminal(stream: TextIO) -> bool:
    """A person is reading ``stream`` (a terminal that can draw), not a program."""
    try:
        return stream.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):  # a closed or fake stream
        return False


def show_table(table: Table, stream: TextIO | None = None) -> None:
    """``table`` on ``stream`` (default stdout): drawn by rich on a terminal, else plain."""
    out = sys.stdout if stream is None else stream
    if not is_terminal(out):
        out.write(table.plain())
        return
    from rich import box
    from rich.console import Console
    from rich.table import Table as RichTable
    from rich.text import Text

    console = Console(file=out, highlight=False)
    for line in table.before:
        console.print(Text(f"# {line}", style="dim"))
    drawn = RichTable(box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False)
    for column in table.columns:
        # every cell whole: a long message id folds onto a second line, never cut
        drawn.add_column(
            column.header, justify="right" if column.right else "left", overflow="fold"
        )
    for row in table.rows:
        drawn.add_row(*(Text(cell, style=_STYLES.get(cell, "")) for cell in row))
    console.print(drawn)
    for line in table.after:
        console.print(Text(f"# {line}", style="dim"))


@contextmanager
def progress_bar(
    label: str, stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic
) -> Iterator[Progress]:
    """A ``progress(done, total)`` callback for long work: a rich bar on a terminal;
    elsewhere a line ``LABEL: DONE/TOTAL`` at most once a second, and the last one."""
    out = sys.stderr if stream is None else stream
    if is_terminal(out):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TimeElapsedColumn
        from rich.progress import Progress as RichProgress

        with RichProgress(
            f"[bold]{label}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(file=out),
            transient=False,
        ) as bar:
            task = bar.add_task(label, total=None)

            def draw(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            yield draw
        return
    with throttled_lines(lambda done, total, _: f"{label}: {done}/{total}", out, clock) as line:
        yield line


@contextmanager
def throttled_lines(
    say: Callable[[int, int, float], str],
    out: TextIO,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[Progress]:
    """A ``progress(done, total)`` callback printing ``say(done, total, now)`` as a whole line
    at most once a second, the last one (``done == total``) always, and on leaving the
    last one not yet printed: progress for a pipe, a file or a CI log."""
    last_at, pending = float("-inf"), ""

    def line(done: int, total: int) -> None:
        nonlocal last_at, pending
        now = clock()
        pending = say(done, total, now)
        if now - last_at >= 1.0 or done == total:
            last_at = now
            print(pending, file=out, flush=True)
            pending = ""

    try:
        yield line
    finally:
        if pending:
            print(pending, file=out, flush=True)
