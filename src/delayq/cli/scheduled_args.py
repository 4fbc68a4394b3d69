"""What the ``delayq scheduled`` commands share: ``--index`` and the filters, the index
they name opened, and the filters read into a :class:`~delayq.schedule.query.Query`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from delayq.cli._common import Args
from delayq.cli.options import once
from delayq.errors import InvalidInput, StoreError

if TYPE_CHECKING:
    from delayq.schedule.base import ScheduleStore
    from delayq.schedule.query import Query

__all__ = ["INDEX_FORMS", "filters", "index_option", "open_index", "query_of"]

INDEX_FORMS = (
    "a SQLite file: sqlite:///PATH or a PATH; postgresql://user:pass@host/db; or "
    "redis://host:6379/0 (rediss://, unix://)"
)


def index_option(*, required: bool = True, what: str = "the schedule index") -> click.Option:
    return once(
        "--index",
        required=required,
        metavar="URL",
        envvar="DELAYQ_SCHEDULE_INDEX" if required else None,
        help=f"{what} ({INDEX_FORMS}" + ("; default $DELAYQ_SCHEDULE_INDEX)" if required else ")"),
    )


def filters() -> list[click.Option]:
    return [
        click.Option(
            ["--state", "states"],
            multiple=True,
            metavar="STATE",
            help="scheduled, rescheduled (the default: both), pending, unconfirmed, "
            "cancelled, promoted, delivered, handled, dead-lettered, or all; repeatable",
        ),
        once("--routing-key", "-k", metavar="PATTERN", help="a topic pattern: orders.#, *.email"),
        once("--destination", metavar="QUEUE", help="routed to this queue"),
        once("--due-before", metavar="DURATION", help="due within this long from now: 10m, 1h"),
        once("--due-after", metavar="DURATION", help="due at least this long from now"),
        click.Option(
            ["--label", "labels"], multiple=True, metavar="K=V", help="a label; repeatable"
        ),
        once("--business-key", metavar="KEY", help="the message's business key"),
        index_option(),
    ]


def open_index(url: str, *, create: bool = False) -> ScheduleStore:
    """The store of ``--index`` (``create``: a new file where there is none, for an
    import; a reader never makes an empty index)."""
    from delayq.schedule.sqlite import SQLiteSchedule

    if not isinstance(url, str) or not url.strip():
        raise InvalidInput(f"--index names {INDEX_FORMS}")
    if url.startswith(("postgresql://", "postgres://")):
        from delayq.schedule.postgres import PostgresSchedule

        return PostgresSchedule(url)
    if url.startswith(("redis://", "rediss://", "unix://")):
        from delayq.schedule.redis import RedisSchedule

        return RedisSchedule(url)
    path = url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else url
    if "://" in path:
        raise InvalidInput(f"--index {url!r}: {INDEX_FORMS}")
    try:
        there = Path(path).is_file()  # a reader never makes an empty index where none was
    except (OSError, ValueError) as exc:  # a name too long, a NUL
        raise StoreError(f"cannot read the schedule index at {path!r} (--index): {exc}") from exc
    if not there and not create:
        what = "a directory" if Path(path).is_dir() else "no such file"
        raise StoreError(f"no schedule index at {path!r} (--index): {what}")
    if there:
        _check_is_index(path)
    return SQLiteSchedule(path)


def _check_is_index(path: str) -> None:
    """A SQLite file given as ``--index`` is a schedule index (or empty, as a new one):
    never the consumers' store or another database, which opening would write a table
    into."""
    import sqlite3
    from urllib.parse import quote

    try:
        db = sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True)
        try:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
        finally:
            db.close()
    except sqlite3.Error:
        return  # not readable this way: opening it says what is wrong
    if tables and "delayq_schedule" not in tables:
        shown = ", ".join(sorted(tables)[:5])
        raise InvalidInput(
            f"--index {path!r} is a SQLite database of other tables ({shown}), not a "
            "schedule index: is it the consumers' store (--store)?"
        )


def query_of(args: Args, namespace: str) -> Query:
    from delayq.durations import to_ms
    from delayq.message.envelope import epoch_ms
    from delayq.schedule.entry import WAITING, State
    from delayq.schedule.query import Query

    states: set[State] | frozenset[State] = WAITING
    if args.states:
        names = [s.strip() for given in args.states for s in given.split(",") if s.strip()]
        states = set(State) if "all" in names else {_state(n) for n in names}
    now = epoch_ms()
    labels: dict[str, str] = {}
    for given in args.labels:
        key, sep, value = given.partition("=")
        if not sep or not key:
            raise InvalidInput(f"--label {given!r}: give KEY=VALUE")
        if key in labels and labels[key] != value:
            raise InvalidInput(
                f"--label {key}= given twice ({labels[key]!r} and {value!r}): a message has "
                "one value per label, so no message matches both; run once for each"
            )
        labels[key] = value
    if args.routing_key is not None and not args.routing_key.strip():
        raise InvalidInput("-k/--routing-key is empty: give a topic pattern (orders.#, *.email)")
    return Query(
        namespace=namespace,
        states=states,
        routing_key=args.routing_key,
        destination=args.destination,
        due_before_ms=None
        if args.due_before is None
        else now + to_ms(args.due_before, what="--due-before"),
        due_after_ms=None
        if args.due_after is None
        else now + to_ms(args.due_after, what="--due-after"),
        labels=labels,
        business_key=args.business_key,
    )


def _state(name: str) -> Any:
    from delayq.schedule.entry import State

    try:
        return State(name)
    except ValueError:
        names = ", ".join(s.value for s in State)
        raise InvalidInput(f"--state {name!r}: the states are {names}, or all") from None
