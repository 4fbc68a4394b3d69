"""``delayq dlq | unrouted``: list, show, replay and purge parked messages."""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any

from delayq.cli._common import (
    EXIT_BROKER,
    EXIT_OK,
    Args,
    fail,
    topology_and_url,
)
from delayq.cli._console import progress_bar, show_table
from delayq.errors import InvalidInput, StoreError
from delayq.message.envelope import epoch_ms
from delayq.topology.intakes import Intake
from delayq.topology.model import Topology
from delayq.wording import counted

if TYPE_CHECKING:
    from delayq.ops.replay_marks import ReplayMarks
    from delayq.schedule.replays import ReplayRecord


def _intake(topology: Topology, name: str) -> Intake | None:
    """The intake ``name`` names (its exchange, or its queue), if any."""
    for intake in topology.intakes:
        if name in (intake.exchange, intake.queue_name(topology.namespace)):
            return intake
    return None


def _parking(args: Args, topology: Topology) -> tuple[str, str]:
    """The parking queue, and what it is called in messages."""
    if args.command == "dlq":
        intake = _intake(topology, args.queue)
        if intake is not None:
            return intake.dlq_name(topology.namespace), f"the DLQ of {args.queue}"
        try:
            topology.destination(args.queue)
        except KeyError:
            intakes = ", ".join(i.exchange for i in topology.intakes)
            raise InvalidInput(
                f"{args.queue!r} is not a destination queue of {args.file}; "
                f"destinations: {', '.join(d.queue for d in topology.destinations) or 'none'}"
                + (f"; intakes: {intakes}" if intakes else "")
            ) from None
        return f"{args.queue}.dlq", f"the DLQ of {args.queue}"
    return topology.unrouted, topology.unrouted


def _identify(intake: Intake | None) -> Any:
    """An intake DLQ's messages published without an id are known by the one its bridge
    derives (:func:`delayq.intake.relay.intake_id`): listed, shown and replayed by it."""
    if intake is None:
        return None
    from delayq.intake.relay import intake_id

    def identify(delivery: Any, properties: Any) -> str:
        key = delivery.origin_routing_key
        return intake_id(intake.exchange, key, delivery.headers, properties, delivery.body)

    return identify


def _print_parked(
    args: Args, url: str, queue: str, label: str, source: str | None, intake: Intake | None
) -> int:
    """``list`` and ``show`` (see delayq.ops.parked_view)."""
    from delayq.ops import parked_view as view
    from delayq.sync import parking

    limit = args.limit if args.parked_command == "list" else 10_000
    found = parking.browse(
        url, queue, limit=limit, dead_letters_of=source, identify=_identify(intake)
    )
    # Everything in <ns>.unrouted is there because no destination bound its routing key.
    reason = None if args.command == "dlq" else "no binding"
    now = epoch_ms()
    if args.parked_command == "show":
        from delayq.ops.parked import find_id

        # `dlq list` may print an id cut short (``abc…``): that, or any prefix, names it
        wanted = find_id(args.message_id, (p.message_id for p in found))
        match = [p for p in found if p.message_id == wanted]
        if not match:
            return fail(
                f"no message {args.message_id!r} in {label} "
                f"({counted(len(found), 'message')} parked)",
                EXIT_BROKER,
                "MessageNotFound",
                as_json=args.json,
            )
        extra = [*os.environ.get("DELAYQ_MASK_HEADERS", "").split(","), *args.mask_header]
        detail = view.message_detail(
            match[0],
            now,
            reason=reason,
            patterns=view.sensitive_patterns(extra),
            reveal=args.reveal,
        )
        sys.stdout.write(json.dumps(detail) + "\n" if args.json else view.render_detail(detail))
        return EXIT_OK
    rows = [view.message_summary(p, now, reason) for p in found]
    if args.json:
        print(json.dumps({"queue": queue, "messages": rows, "limit": limit}))
    elif not rows:
        print(f"{label} is empty")
    else:
        show_table(view.list_table(rows, limit))
    return EXIT_OK


def _replay_marks(args: Args) -> ReplayMarks | None:
    """``dlq replay --store URL [--uncancel]``: the store opened (reached now, before
    anything is replayed), as a :class:`~delayq.ops.replay_marks.ReplayMarks`."""
    store_url = getattr(args, "store", None)
    if getattr(args, "uncancel", False) and store_url is None:
        raise InvalidInput(
            "--uncancel needs --store URL: the consumers' idempotency store, where the "
            "cancels to clear are"
        )
    if store_url is None:
        return None
    from delayq.cli.store_url import open_store
    from delayq.ops.replay_marks import ReplayMarks

    store = open_store(store_url)
    try:
        return ReplayMarks(store, args.queue, uncancel=args.uncancel, key_scope=args.key_scope)
    except BaseException:
        store.close()
        raise


def _replay_record(args: Args, topology: Topology, intake: object) -> ReplayRecord | None:
    """``replay --schedule-index URL``: the index opened (a new SQLite file made) before
    anything is replayed; refused for an intake's DLQ, whose bridge records what it
    forwards."""
    url = getattr(args, "schedule_index", None)
    if url is None:
        return None
    if intake is not None:
        raise InvalidInput(
            f"--schedule-index: {args.queue} is an intake's; its replays go back through "
            "the intake, and its bridge records them (delayq bridge --schedule-index URL)"
        )
    from delayq.schedule.record import ScheduleIndex
    from delayq.schedule.replays import ReplayRecord as Record
    from delayq.schedule.url import open_index

    # Never made here: a replay writes into the index its messages were recorded in.
    try:
        store = open_index(url, made=True, what="--schedule-index")
    except StoreError as exc:
        raise type(exc)(f"{exc}; nothing was replayed") from exc
    return Record(ScheduleIndex(store), topology)


def _close(store: object) -> None:
    close = getattr(store, "close", None)
    if callable(close):
        close()


def cmd_parked(args: Args) -> int:
    from delayq.sync import parking

    topology, url = topology_and_url(args)  # the file's vhost is the URL's, or refused
    queue, label = _parking(args, topology)
    action = args.parked_command
    if action == "purge":
        if not args.yes:
            raise InvalidInput(f"purge deletes every message of {queue}: add --yes to confirm")
        print(f"purged {counted(parking.purge(url, queue), 'message')} from {queue}")
        return EXIT_OK
    intake = _intake(topology, args.queue) if args.command == "dlq" else None
    if action in ("list", "show"):
        source = args.queue if args.command == "dlq" else None
        if intake is not None:
            source = intake.queue_name(topology.namespace)
        return _print_parked(args, url, queue, label, source, intake)

    if intake is not None:
        exchange = intake.exchange

        def target(parked: Any) -> tuple[str, str]:
            # Back through the intake, under the routing key it was published with: the
            # bridge reads its x-delay again (a tier or binding added since, say).
            return exchange, parked.delivery.origin_routing_key

    elif args.command == "dlq":

        def target(parked: Any) -> tuple[str, str]:
            return "", args.queue  # the default exchange: this queue alone
    else:

        def target(parked: Any) -> tuple[str, str]:
            return topology.ready_exchange, parked.delivery.origin_routing_key

    record = _replay_record(args, topology, intake)
    marks = _replay_marks(args)
    try:
        with progress_bar("replaying") as progress:
            report = parking.replay(
                url,
                queue,
                topology,
                target=target,
                ids=None if args.all else list(args.ids),
                rate_per_s=args.rate,
                progress=progress,
                marks=marks,
                identify=_identify(intake),
                record=record,
            )
    finally:
        if marks is not None:
            _close(marks.store)
        if record is not None:
            record.index.store.close()
    if report.seen == 0:
        print(f"{label} is empty: nothing to replay")
    else:
        print(
            f"replayed {len(report.replayed)} of {counted(report.seen, 'parked message')} "
            f"from {queue}"
        )
    if marks is not None:
        for line in marks.summary(report.replayed):
            print(line)
    if report.returned:
        print(
            f"delayq: {len(report.returned)} came straight back to {label}, their routing "
            f"keys still matching no binding (e.g. {', '.join(report.returned[:5])}): bind "
            "them (topology destinations, then `delayq topology apply`) and replay again",
            file=sys.stderr,
        )
    if report.missing:
        print(f"delayq: not found in {label}: {', '.join(report.missing)}", file=sys.stderr)
    if report.unrecorded:
        print(
            f"delayq: {len(report.unrecorded)} replayed, but the schedule index still shows "
            f"them pending (e.g. {', '.join(report.unrecorded[:5])}; the log says why): do not "
            "replay them again; a consumer's reporter moves them on",
            file=sys.stderr,
        )
    if report.clashing:
        print(
            f"delayq: {len(report.clashing)} left in {label}: their ids wait in another "
            f"namespace of the schedule index (e.g. {', '.join(report.clashing[:5])}), which "
            "holds one entry per id; replay them without --schedule-index, or into an index "
            "of this namespace",
            file=sys.stderr,
        )
    if report.kept:
        print(
            f"delayq: {len(report.kept)} left in {label}: their headers cannot be read or "
            f"sent again (e.g. {', '.join(report.kept[:5])}; `delayq dlq show` says why)",
            file=sys.stderr,
        )
    failed = (
        report.missing or report.returned or report.kept or report.unrecorded or report.clashing
    )
    return EXIT_BROKER if failed else EXIT_OK
