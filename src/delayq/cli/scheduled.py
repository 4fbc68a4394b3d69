"""``delayq scheduled list | count | show``: what the schedule index (issue 51,
:mod:`delayq.schedule`) says is waiting, for the topology's namespace.

Exit codes: 0 answered (``show`` of an id the index does not hold: 1); 1 the index
could not be read; 2 bad input.
"""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from delayq.cli._common import EXIT_BROKER, EXIT_OK, Args, load_cli_topology, print_json
from delayq.cli._console import show_table
from delayq.cli.options import group, json_flag, leaf, once
from delayq.errors import InvalidInput, StoreError
from delayq.tables import Column, Table

if TYPE_CHECKING:
    from delayq.schedule.base import ScheduleStore
    from delayq.schedule.entry import Entry
    from delayq.schedule.query import Cursor, Query

__all__ = ["open_index", "scheduled_group"]

INDEX_FORMS = "a SQLite file: sqlite:///PATH or a PATH"


def _index_option() -> click.Option:
    return once(
        "--index",
        required=True,
        metavar="URL",
        envvar="DELAYQ_SCHEDULE_INDEX",
        help=f"the schedule index ({INDEX_FORMS}; default $DELAYQ_SCHEDULE_INDEX)",
    )


def _filters() -> list[click.Option]:
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
        _index_option(),
    ]


def scheduled_group() -> click.Group:
    return group(
        "scheduled",
        "what the schedule index says is waiting: list, count, show",
        [
            leaf(
                "list",
                cmd_list,
                "list scheduled messages, soonest due first",
                [
                    *_filters(),
                    once("--limit", type=int, default=100, help="entries a page (default 100)"),
                    once("--after", metavar="CURSOR", help="the page after this (its 'next')"),
                    json_flag("print the entries and the next page's cursor as JSON"),
                ],
                url=False,
                file=True,
            ),
            leaf(
                "count",
                cmd_count,
                "count scheduled messages",
                [*_filters(), json_flag("print the count as JSON")],
                url=False,
                file=True,
            ),
            leaf(
                "show",
                cmd_show,
                "one message's entry by its id",
                [
                    once("--message-id", required=True, help="the message's id"),
                    _index_option(),
                    json_flag("print the entry as JSON"),
                ],
                url=False,
                file=False,
            ),
        ],
    )


def open_index(url: str) -> ScheduleStore:
    """The store of ``--index``."""
    from delayq.schedule.sqlite import SQLiteSchedule

    if not isinstance(url, str) or not url.strip():
        raise InvalidInput(f"--index names {INDEX_FORMS}")
    path = url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else url
    if "://" in path:
        raise InvalidInput(f"--index {url!r}: only {INDEX_FORMS} for now")
    try:
        there = Path(path).is_file()  # a reader never makes an empty index where none was
    except (OSError, ValueError) as exc:  # a name too long, a NUL
        raise StoreError(f"cannot read the schedule index at {path!r} (--index): {exc}") from exc
    if not there:
        raise StoreError(f"no schedule index at {path!r} (--index): no such file")
    return SQLiteSchedule(path)


def _query(args: Args, namespace: str) -> Query:
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
        labels[key] = value
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


def _cursor(text: str | None) -> Cursor | None:
    if text is None:
        return None
    due, sep, entry_id = text.partition(":")
    if not sep or not due.isdigit() or not entry_id:
        raise InvalidInput(f"--after {text!r}: give the 'next' a page printed (DUE_MS:ID)")
    return (int(due), entry_id)


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="seconds")


def entry_json(entry: Entry) -> dict[str, Any]:
    return {
        "id": entry.id,
        "namespace": entry.namespace,
        "routing_key": entry.routing_key,
        "destinations": list(entry.destinations),
        "state": entry.state.value,
        "tier": entry.tier,
        "due_at": _when(entry.due_at_ms),
        "due_at_ms": entry.due_at_ms,
        "published_at_ms": entry.published_at_ms,
        "size": entry.size,
        "business_key": entry.business_key,
        "labels": dict(entry.labels),
        "generation": entry.generation,
        "body_kept": entry.body is not None,
    }


def cmd_list(args: Args) -> int:
    from delayq.schedule.base import check_limit
    from delayq.schedule.query import page_key

    limit = check_limit(args.limit)
    after = _cursor(args.after)
    query = _query(args, load_cli_topology(args).namespace)
    store = open_index(args.index)
    try:
        page = store.find(query, after=after, limit=limit)
    finally:
        store.close()
    cursor = page_key(page[-1]) if len(page) == limit else None
    following = None if cursor is None else f"{cursor[0]}:{cursor[1]}"
    if args.json:
        print_json({"entries": [entry_json(e) for e in page], "next": following})
        return EXIT_OK
    table = Table(
        [Column("id"), Column("routing key"), Column("tier"), Column("due at"), Column("state")]
    )
    for e in page:
        table.add(e.id, e.routing_key, e.tier, _when(e.due_at_ms), e.state.value)
    if following is not None:
        table.after.append(f"more: --after {following}")
    show_table(table)
    return EXIT_OK


def cmd_count(args: Args) -> int:
    query = _query(args, load_cli_topology(args).namespace)
    store = open_index(args.index)
    try:
        found = store.count(query)
    finally:
        store.close()
    if args.json:
        print_json({"count": found})
    else:
        print(found)
    return EXIT_OK


def cmd_show(args: Args) -> int:
    store = open_index(args.index)
    try:
        entry = store.get(args.message_id)
    finally:
        store.close()
    if entry is None:
        print(f"delayq: no entry {args.message_id!r} in the index", file=sys.stderr)
        if args.json:
            print_json({"entry": None})
        return EXIT_BROKER
    if args.json:
        print_json({"entry": entry_json(entry)})
        return EXIT_OK
    for key, value in entry_json(entry).items():
        print(f"{key:16} {value}")
    return EXIT_OK
