"""``delayq scheduled list | count | show``: what the schedule index (issue 51,
:mod:`delayq.schedule`) says is waiting, for the topology's namespace.

Exit codes: 0 answered (``show`` of an id the index does not hold: 1); 1 the index
could not be read; 2 bad input.
"""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import click

from delayq.cli._common import EXIT_BROKER, EXIT_OK, Args, load_cli_topology, print_json
from delayq.cli._console import show_table
from delayq.cli.options import group, json_flag, leaf, once
from delayq.cli.scheduled_args import filters, index_option, open_index, query_of
from delayq.cli.scheduled_change import change_commands
from delayq.cli.scheduled_transfer import transfer_commands
from delayq.errors import InvalidInput
from delayq.tables import Column, Table

if TYPE_CHECKING:
    from delayq.schedule.entry import Entry
    from delayq.schedule.query import Cursor

__all__ = ["scheduled_group"]


def scheduled_group() -> click.Group:
    return group(
        "scheduled",
        "what is scheduled: list, count, show, cancel, reschedule, promote, purge, expire, "
        "export, import, metrics",
        [
            leaf(
                "list",
                cmd_list,
                "list scheduled messages, soonest due first",
                [
                    *filters(),
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
                [*filters(), json_flag("print the count as JSON")],
                url=False,
                file=True,
            ),
            leaf(
                "show",
                cmd_show,
                "one message's entry by its id",
                [
                    once("--message-id", required=True, help="the message's id"),
                    index_option(),
                    json_flag("print the entry as JSON"),
                ],
                url=False,
                file=False,
            ),
            leaf(
                "expire",
                cmd_expire,
                "delete the entries of finished messages older than a retention",
                [
                    once(
                        "--older-than",
                        required=True,
                        help="finished (unconfirmed, cancelled, handled, dead-lettered) "
                        'and unchanged for this long, for example "7d", "12h"',
                    ),
                    index_option(),
                    json_flag("print the count as JSON"),
                ],
                url=False,
                file=False,
            ),
            leaf(
                "metrics",
                cmd_metrics,
                "serve the index's Prometheus gauges (waiting by tier, due soon, overdue)",
                [
                    once(
                        "--port",
                        type=int,
                        required=True,
                        metavar="N",
                        help="port to serve /metrics on (0: any free port)",
                    ),
                    once(
                        "--addr",
                        default="127.0.0.1",
                        metavar="ADDR",
                        help="address to listen on (default 127.0.0.1; 0.0.0.0 for all)",
                    ),
                    index_option(),
                ],
                url=False,
                file=True,
            ),
            *change_commands(),
            *transfer_commands(),
        ],
    )


def _cursor(text: str | None) -> Cursor | None:
    if text is None:
        return None
    from delayq.schedule.entry import MAX_MS

    due, sep, entry_id = text.partition(":")
    if not sep or not (due.isascii() and due.isdigit()) or not entry_id or int(due) >= MAX_MS:
        raise InvalidInput(f"--after {text!r}: give the 'next' a page printed (DUE_MS:ID)")
    return (int(due), entry_id)


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="seconds")


def entry_json(entry: Entry) -> dict[str, Any]:
    from delayq.schedule.transfer import entry_fields

    return {
        **entry_fields(entry),
        "due_at": _when(entry.due_at_ms),
        "body_kept": entry.body is not None,
    }


def cmd_list(args: Args) -> int:
    from delayq.schedule.base import check_limit
    from delayq.schedule.query import page_key

    limit = check_limit(args.limit)
    after = _cursor(args.after)
    query = query_of(args, load_cli_topology(args).namespace)
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
    query = query_of(args, load_cli_topology(args).namespace)
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


def cmd_expire(args: Args) -> int:
    from delayq.durations import to_ms
    from delayq.message.envelope import epoch_ms

    older_than_ms = to_ms(args.older_than, what="--older-than")
    store = open_index(args.index)
    try:
        deleted = store.expire(finished_before_ms=epoch_ms() - older_than_ms)
    finally:
        store.close()
    if args.json:
        print_json({"deleted": deleted})
    else:
        print(f"deleted {deleted:,} finished entries")
    return EXIT_OK


def cmd_metrics(args: Args) -> int:
    """Until SIGTERM/SIGINT (exit 0)."""
    import signal
    import threading

    from delayq.observe.metrics import serve_metrics
    from delayq.schedule.gauges import ScheduleGauges

    if not 0 <= args.port <= 65535:
        raise InvalidInput(f"--port is a port number (0 to 65535), not {args.port}")
    namespace = load_cli_topology(args).namespace
    store = open_index(args.index)
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        gauges = ScheduleGauges(store, namespace)
        try:
            server = serve_metrics(gauges.registry, args.port, args.addr)
        except OSError as exc:
            raise InvalidInput(f"cannot listen on {args.addr}:{args.port}: {exc}") from exc
        print(f"delayq: the index's gauges of {namespace!r} at {server.url}", file=sys.stderr)
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass
        server.close()
    finally:
        signal.signal(signal.SIGTERM, previous)
        store.close()
    return EXIT_OK
