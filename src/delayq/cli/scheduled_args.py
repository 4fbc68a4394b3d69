"""What the ``delayq scheduled`` commands share: ``--index`` and the filters, the index
they name opened, and the filters read into a :class:`~delayq.schedule.query.Query`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from delayq.cli._common import Args
from delayq.cli.options import once
from delayq.errors import InvalidInput
from delayq.schedule.url import INDEX_FORMS, open_index

if TYPE_CHECKING:
    from delayq.schedule.query import Query

__all__ = ["INDEX_FORMS", "filters", "index_option", "open_index", "query_of"]


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
