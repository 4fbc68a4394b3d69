"""``delayq scheduled cancel | reschedule | promote | purge``: changes to what is scheduled, made
as a publisher's reschedules and cancels (marks in the consumers' store, ``--store``)
that the schedule index (``--index``) follows: :class:`delayq.schedule.api.Schedule`.

Exit codes: 0 every message was moved, promoted or cancelled; 1 some lost the race with
a handler (``in progress``, ``already handled``), or the broker or a store failed (what
was done before is printed); 2 bad input (nothing was changed).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import click

from delayq.cli._common import EXIT_BROKER, EXIT_OK, Args, print_json, topology_and_url
from delayq.cli.options import flag, json_flag, leaf, once, store_option
from delayq.cli.scheduled_args import filters, index_option, open_index, query_of
from delayq.errors import InvalidInput
from delayq.wording import counted

if TYPE_CHECKING:
    from delayq.message.cancel import CancelReceipt, RescheduleReceipt
    from delayq.schedule.api import Schedule

__all__ = ["change_commands"]


def change_commands() -> list[click.Command]:
    ids = click.Option(
        ["--message-id", "message_ids"],
        multiple=True,
        required=True,
        metavar="ID",
        help="a message id the index holds; repeatable",
    )
    return [
        leaf(
            "cancel",
            cmd_cancel,
            "cancel messages by their ids; they are acked unhandled when due",
            [ids, store_option(), index_option(), json_flag("print the receipts as JSON")],
            url=True,
            file=True,
        ),
        leaf(
            "reschedule",
            cmd_reschedule,
            "move messages to a new time by their ids alone (the index kept their bodies)",
            [
                ids,
                once("--delay", "-d", help='from now, for example "90s", "15m", "1h30m"'),
                store_option(),
                index_option(),
                json_flag("print the receipts as JSON"),
            ],
            url=True,
            file=True,
            one_of=[("delay",)],
        ),
        leaf(
            "promote",
            cmd_promote,
            "deliver messages now; their waiting copies are acked unhandled when due",
            [ids, store_option(), index_option(), json_flag("print the receipts as JSON")],
            url=True,
            file=True,
        ),
        leaf(
            "purge",
            cmd_purge,
            "cancel every scheduled message that matches the filters",
            [
                *filters(),
                flag("--all", help="every waiting message of the namespace (no filter)"),
                store_option(),
                json_flag("print the counts as JSON"),
            ],
            url=True,
            file=True,
        ),
    ]


@contextmanager
def _schedule(args: Args) -> Iterator[Schedule]:
    from delayq.cli.store_url import open_store
    from delayq.schedule.api import Schedule
    from delayq.schedule.record import ScheduleIndex
    from delayq.sync.publisher import Publisher

    topology, url = topology_and_url(args)
    index = open_index(args.index)
    try:
        store = open_store(args.store)
        try:
            with Publisher(url, topology, store=store, schedule=ScheduleIndex(index)) as pub:
                yield Schedule(index, pub)
        finally:
            store.close()
    finally:
        index.close()


def _moved(receipts: Sequence[RescheduleReceipt], as_json: bool) -> int:
    rows = [
        {
            "message_id": r.marks.message_id,
            "moved": r.moved,
            "status": r.marks.status.value,
            "tier": None if r.receipt is None else r.receipt.tier,
        }
        for r in receipts
    ]
    if as_json:
        print_json({"receipts": rows})
    else:
        for row in rows:
            print(f"{row['message_id']}  {'moved' if row['moved'] else row['status']}")
    refused = [r for r in receipts if not r.moved]
    if refused:
        print(
            f"delayq: {counted(len(refused), 'message')} not moved: the mark was refused "
            "(already handled, in progress, cancelled, or a newer reschedule)",
            file=sys.stderr,
        )
        return EXIT_BROKER
    return EXIT_OK


def cmd_reschedule(args: Args) -> int:
    with _schedule(args) as schedule:
        receipts = schedule.reschedule(args.message_ids, args.delay)
    return _moved(receipts, args.json)


def cmd_promote(args: Args) -> int:
    with _schedule(args) as schedule:
        receipts = schedule.promote(args.message_ids)
    return _moved(receipts, args.json)


def cmd_cancel(args: Args) -> int:
    with _schedule(args) as schedule:
        receipts = schedule.cancel(args.message_ids)
    return _cancelled(receipts, len(receipts), args.json, each=True)


def _cancelled(
    receipts: Sequence[CancelReceipt], matched: int, as_json: bool, *, each: bool
) -> int:
    """Print what the cancels did (``each``: a line or JSON row per message too)."""
    stopped = sum(r.cancelled for r in receipts)
    lost = len(receipts) - stopped
    if as_json:
        rows = [
            {"message_id": r.message_id, "cancelled": r.cancelled, "status": _said(r)}
            for r in receipts
        ]
        print_json(
            {"matched": matched, "cancelled": stopped, "not_cancelled": lost}
            | ({"receipts": rows} if each else {})
        )
    else:
        for r in receipts if each else ():
            print(f"{r.message_id}  {_said(r)}")
        print(f"cancelled {stopped:,} of {len(receipts):,}")
    if lost:
        print(
            f"delayq: {counted(lost, 'message')} not cancelled: the cancel lost the race "
            "with a handler (in progress or already handled)",
            file=sys.stderr,
        )
        return EXIT_BROKER
    return EXIT_OK


def _said(receipt: CancelReceipt) -> str:
    """A cancel's outcome in words: ``already cancelled`` is not said ``cancelled``."""
    from delayq.stores.base import CancelStatus

    if receipt.status is CancelStatus.ALREADY_CANCELLED:
        return "already cancelled"
    return "cancelled" if receipt.cancelled else f"not cancelled ({receipt.status.value})"


def cmd_purge(args: Args) -> int:
    given = (args.states, args.routing_key, args.destination, args.due_before, args.due_after)
    if not args.all and not any(given) and not args.labels and args.business_key is None:
        raise InvalidInput(
            "purge cancels every match: give a filter (--label, -k, --due-before, ...) "
            "or --all for every waiting message of the namespace"
        )
    receipts: list[CancelReceipt] = []
    with _schedule(args) as schedule:
        query = query_of(args, schedule.publisher.topology.namespace)  # type: ignore[union-attr]
        total = schedule.count(query)
        print(f"delayq: purging {counted(total, 'message')} ...", file=sys.stderr)

        done = [0]

        def progress(count: int) -> None:
            done[0] = count
            print(f"  {count:,} / {total:,}", file=sys.stderr)

        try:
            receipts = schedule.purge(query, progress=progress).receipts
        except Exception:
            print(f"delayq: stopped after {counted(done[0], 'message')} (those are cancelled)",
                  file=sys.stderr)  # fmt: skip
            raise
    return _cancelled(receipts, total, args.json, each=False)
