"""``delayq cancel`` and ``delayq reschedule``: marks in the consumers' idempotency store
(see ``docs/concepts/cancel.md``). A cancel plans and writes its marks as
:meth:`delayq.sync.publisher.Publisher.cancel_many` does, without a broker (it takes no
``--url``); a reschedule publishes through :meth:`~delayq.sync.publisher.Publisher.reschedule`.

Exit codes: 0 every message is marked (``cancelled``, ``unknown``, ``already
cancelled``), or the reschedule published its new copy; 1 a cancel lost the race with a
handler (``in progress``, ``already handled``), a reschedule was refused, or the store
failed (what was done before is printed); 2 bad input (nothing was marked).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from delayq.cli._common import (
    EXIT_BROKER,
    EXIT_OK,
    Args,
    load_cli_topology,
    print_json,
    topology_and_url,
)
from delayq.cli._console import show_table
from delayq.cli.options import (
    PathParam,
    flag,
    json_flag,
    key_scope_option,
    leaf,
    once,
    queue_option,
    store_option,
)
from delayq.cli.store_url import open_store
from delayq.errors import InvalidDelay, InvalidInput, StoreError
from delayq.tables import Column, Table
from delayq.wording import counted

if TYPE_CHECKING:  # cancel_commands is read by every --help: the cancel loads to run
    from delayq.message.cancel import CancelReceipt, RescheduleReceipt
    from delayq.stores.base import IdempotencyStore
    from delayq.topology.model import Topology

__all__ = ["BATCH", "cancel_commands", "cmd_cancel", "cmd_reschedule"]

BATCH = 500
"""Messages per store round trip: a store failure stops at a batch, and what the batches
before it did is printed."""


def cancel_commands() -> list[click.Command]:
    return [
        leaf(
            "cancel",
            cmd_cancel,
            "cancel scheduled messages: their handlers will not run",
            [
                click.Option(
                    ["--message-id", "message_ids"],
                    multiple=True,
                    metavar="ID",
                    help="a message id (consumers keyed by message id); repeatable",
                ),
                click.Option(
                    ["--key", "keys"],
                    multiple=True,
                    metavar="K",
                    help="a business key (consumers with key=, and bulk-scheduled "
                    "messages); repeatable",
                ),
                once(
                    "--from-file",
                    type=PathParam(),
                    metavar="PATH",
                    help="read message ids (or keys, with --file-has-keys) one a line; "
                    "'-' for stdin; blank lines and # comments skipped",
                ),
                flag("--file-has-keys", help="--from-file lines are business keys"),
                once(
                    "--routing-key",
                    "-k",
                    help="mark only the queues this routing key reaches (default: every "
                    "destination of the topology)",
                ),
                store_option(),
                queue_option(),
                key_scope_option(),
                json_flag("print the receipts as JSON"),
            ],
            url=False,  # marks the store only: a --url would be one it does not use
            file=True,
            one_of=[("message_ids", "keys", "from_file")],
        ),
        leaf(
            "reschedule",
            cmd_reschedule,
            "move a scheduled message to a new time (its body and routing key again)",
            [
                once("--message-id", help="the message's id"),
                once("--key", help="the message's business key"),
                once("--delay", "-d", help='from now, for example "90s", "15m", "1h30m"'),
                once(
                    "--due-at",
                    metavar="ISO8601",
                    help="a time with its zone, e.g. 2026-11-25T18:00:00+01:00 (past: now)",
                ),
                once("--body", help="the body as JSON text, as published"),
                once(
                    "--body-file",
                    type=PathParam(),
                    help="the body as this file's bytes",
                ),
                once("--routing-key", "-k", required=True, help="the routing key, as published"),
                store_option(),
                queue_option(),
                key_scope_option(),
                json_flag("print the receipt as JSON"),
            ],
            url=True,
            file=True,
            one_of=[("message_id", "key"), ("delay", "due_at"), ("body", "body_file")],
        ),
    ]


# cancel ------------------------------------------------------------------------------


def _read_names(path: Path) -> list[str]:
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"cannot read --from-file {str(path)!r}: {exc}") from exc
    names = [line.strip() for line in text.splitlines()]
    names = [name for name in names if name and not name.startswith("#")]
    if not names:
        raise InvalidInput(f"--from-file {str(path)!r} names no message (empty)")
    return names


def _requests(args: Args) -> tuple[str, list[str]]:
    """('message_ids' or 'keys', the names), from the options or the file."""
    if args.file_has_keys and args.from_file is None:
        raise InvalidInput("--file-has-keys goes with --from-file")
    if args.from_file is not None:
        return ("keys" if args.file_has_keys else "message_ids"), _read_names(args.from_file)
    if args.message_ids and args.keys:
        raise InvalidInput("give --message-id or --key, not both: a consumer keys by one")
    if args.message_ids:
        return "message_ids", list(dict.fromkeys(args.message_ids))
    return "keys", list(dict.fromkeys(args.keys))


def _receipt_json(receipt: CancelReceipt) -> dict[str, Any]:
    return {
        "message_id": receipt.message_id,
        "key": receipt.key,
        "status": receipt.status.value,
        "cancelled": receipt.cancelled,
        "queues": {queue: status.value for queue, status in receipt.queues.items()},
    }


def _queues_cell(receipt: CancelReceipt) -> str:
    return " ".join(f"{queue}={status.value}" for queue, status in receipt.queues.items())


def _cancel_table(receipts: Sequence[CancelReceipt], by: str) -> Table:
    table = Table(
        [Column("key" if by == "keys" else "message_id"), Column("status"), Column("queues")]
    )
    for receipt in receipts:
        name = receipt.key if by == "keys" else receipt.message_id
        table.add(name or "", receipt.status.value, _queues_cell(receipt))
    return table


def _cancel_batch(
    store: IdempotencyStore, topology: Topology, args: Args, by: str, names: list[str]
) -> list[CancelReceipt]:
    """Mark ``names`` (message ids or keys, as ``by`` says), as ``Publisher.cancel_many``
    does: planned from the topology, written in one store round trip; no broker."""
    from delayq.message.cancel import plan_cancels
    from delayq.message.envelope import epoch_ms
    from delayq.stores.base import run_cancels

    plan = plan_cancels(
        topology,
        now_ms=epoch_ms(),
        message_ids=names if by == "message_ids" else None,
        keys=names if by == "keys" else None,
        routing_key=args.routing_key,
        queues=args.queues,
        key_scope=args.key_scope,
    )
    return plan.receipts(run_cancels(store, plan.ops))


def cmd_cancel(args: Args) -> int:
    by, names = _requests(args)
    topology = load_cli_topology(args)
    store = open_store(args.store)
    receipts: list[CancelReceipt] = []
    failure: StoreError | None = None
    try:
        for start in range(0, len(names), BATCH):
            try:
                receipts += _cancel_batch(store, topology, args, by, names[start : start + BATCH])
            except StoreError as exc:
                failure = exc
                break
    finally:
        store.close()
    if args.json:
        print_json(
            {
                "receipts": [_receipt_json(r) for r in receipts],
                "not_done": names[len(receipts) :],
                "error": None if failure is None else str(failure),
            }
        )
    elif receipts:
        show_table(_cancel_table(receipts, by))
    lost = [r for r in receipts if not r.cancelled]
    if failure is not None:
        print(
            f"delayq: error: the store failed after {counted(len(receipts), 'message')} "
            f"(shown); {counted(len(names) - len(receipts), 'message')} not cancelled: "
            f"{failure}",
            file=sys.stderr,
        )
        return EXIT_BROKER
    if lost:
        print(
            f"delayq: {counted(len(lost), 'message')} not cancelled: the cancel lost the race "
            "with a handler (in progress: running now; already handled: done)",
            file=sys.stderr,
        )
        return EXIT_BROKER
    return EXIT_OK


# reschedule --------------------------------------------------------------------------


def _due_at(args: Args) -> datetime | None:
    """``--due-at`` read as ISO 8601, and checked as the reschedule will check it (its time
    zone) before anything is opened: a bad value changes nothing, creates no store file."""
    from delayq.message.cancel import delay_until

    if args.due_at is None:
        return None
    try:
        due_at = datetime.fromisoformat(args.due_at)
    except ValueError as exc:
        raise InvalidDelay(
            f"--due-at {args.due_at!r} is not an ISO 8601 time (e.g. 2026-11-25T18:00:00Z)"
        ) from exc
    delay_until(None, due_at, now_ms=0)  # the core's one check, made early
    return due_at


def _reschedule_json(found: RescheduleReceipt) -> dict[str, Any]:
    receipt = found.receipt
    return {
        "moved": found.moved,
        "generation": found.generation,
        "marks": _receipt_json(found.marks),
        "message_id": None if receipt is None else receipt.message_id,
        "tier": None if receipt is None else (receipt.tier or "immediate"),
        "due_at": None if receipt is None else receipt.due_at.isoformat(),
    }


def cmd_reschedule(args: Args) -> int:
    from delayq.cli.run import _body
    from delayq.sync.publisher import Publisher

    topology, url = topology_and_url(args)  # before the store is opened
    body = _body(args, topology.limits.max_body_bytes)
    due_at = _due_at(args)
    store = open_store(args.store)
    try:
        with Publisher(url, topology, store=store) as publisher:
            found = publisher.reschedule(
                body,
                args.routing_key,
                args.delay,
                due_at=due_at,
                message_id=args.message_id,
                key=args.key,
                queues=args.queues,
                key_scope=args.key_scope,
            )
    finally:
        store.close()
    fields = _reschedule_json(found)
    if args.json:
        print_json(fields)
    else:
        for name in ("moved", "message_id", "tier", "due_at", "generation"):
            print(f"{name:<11} {fields[name]}")
        print(f"{'marks':<11} {_queues_cell(found.marks)}")
    if not found.moved:
        print(
            f"delayq: not rescheduled ({found.marks.status.value}): no queue took the mark, "
            "nothing was published",
            file=sys.stderr,
        )
        return EXIT_BROKER
    return EXIT_OK
