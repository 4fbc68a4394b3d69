"""Routing by headers: a destination's x-match tables, and the namespace that routes by them.

The plugin's ``x-delayed-type: headers`` exchange routed a message by its headers, not
its routing key. delayq reproduces it behind the namespace's ready exchange (a topic
exchange): a namespace with a ``headers`` intake, or a destination with ``headers``,
gets a headers exchange ``<ns>.headers``, bound from ``<ns>.ready`` with ``#`` (and
from ``<ns>.delivery`` with every cascade route key, for the exact strategy). Each
destination binds to it once per table, the table being the binding's arguments:

>>> check_table({"x-match": "any", "tenant": "acme", "priority": 1})
{'x-match': 'any', 'tenant': 'acme', 'priority': 1}
>>> table_matches({"x-match": "all", "tenant": "acme"}, {"tenant": "acme", "delayq-tier": "1s"})
True

What no table matches goes to the headers exchange's alternate exchange,
``<ns>.unrouted`` (the ready exchange's ``#`` binding always matches, so its own
alternate never fires). For the same reason a namespace routes either by routing key or
by headers, never both: a message routed by key would also reach the headers exchange,
match no table, and leave a copy in ``<ns>.unrouted``.

``x-match`` is ``all`` (RabbitMQ's default: every key of the table present with that
value) or ``any`` (one of them); ``all-with-x`` and ``any-with-x`` (RabbitMQ 3.10+) also
compare ``x-`` keys. Message headers a table does not name never count, so the
``delayq-*`` headers delayq adds, and ``x-delay``, do not disturb a match. A table with
no key and ``all`` matches every message. A queue two tables (or routes) reach gets one
copy of a message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import StrictBool, StrictInt, StrictStr

from delayq.wording import shown_int

if TYPE_CHECKING:
    from delayq.topology.model import Topology

__all__ = [
    "MATCH_MODES",
    "X_MATCH",
    "HeaderTable",
    "HeaderValue",
    "check_header_routing",
    "check_table",
    "check_tables",
    "table_matches",
    "table_text",
]

X_MATCH = "x-match"

MATCH_MODES = ("all", "any", "all-with-x", "any-with-x")
"""RabbitMQ's ``x-match`` values (the ``-with-x`` ones from 3.10)."""

HeaderValue = StrictBool | StrictInt | StrictStr
"""What a table compares a header with: text, an integer or a boolean (exact types: a
header ``1`` does not match a table's ``"1"`` nor ``true``)."""

HeaderTable = dict[str, HeaderValue]

_RESERVED = "delayq-"
_INT_RANGE = (-(2**63), 2**63 - 1)


def check_table(table: Mapping[str, Any]) -> dict[str, Any]:
    """One x-match table, as RabbitMQ will read it; ``ValueError`` saying what is wrong."""
    mode = table.get(X_MATCH, "all")
    if mode not in MATCH_MODES:
        raise ValueError(f"{X_MATCH} must be one of {', '.join(MATCH_MODES)}; not {mode!r}")
    with_x = str(mode).endswith("-with-x")
    keys = [key for key in table if key != X_MATCH]
    for key in keys:
        if not key or len(key.encode("utf-8")) > 128:
            raise ValueError(f"header name {key!r} must be 1 to 128 bytes (an AMQP table key)")
        if key.lower().startswith(_RESERVED):
            raise ValueError(
                f"header {key!r}: the 'delayq-' headers are delayq's envelope, written anew on "
                "every message; match your own headers"
            )
        if key.startswith("x-") and not with_x:
            raise ValueError(
                f"header {key!r}: RabbitMQ ignores 'x-' keys of a binding unless x-match is "
                "all-with-x or any-with-x; set that, or match another header"
            )
        value = table[key]
        if isinstance(value, int) and not isinstance(value, bool):
            if not _INT_RANGE[0] <= value <= _INT_RANGE[1]:
                raise ValueError(
                    f"header {key!r}: {shown_int(value)} does not fit in signed 64 bits (-2**63 "
                    "to 2**63 - 1), the widest int AMQP carries"
                )
    if not keys and str(mode).startswith("any"):
        raise ValueError(f"an x-match {mode!r} table with no header matches no message")
    return dict(table)


def check_tables(tables: tuple[dict[str, Any], ...]) -> tuple[dict[str, Any], ...]:
    """A destination's tables: each valid, none twice."""
    checked = tuple(check_table(table) for table in tables)
    seen: set[str] = set()
    for table in checked:
        text = table_text(table)
        if text in seen:
            raise ValueError(f"header table {text} is listed twice")
        seen.add(text)
    return checked


def table_text(table: Mapping[str, Any]) -> str:
    """A table as one stable line (``x-match`` spelled out): what ``verify`` compares and
    ``plan`` shows. ``True`` and ``1`` stay apart."""
    items = {X_MATCH: "all", **table}
    return "{" + ", ".join(f"{k}={_shown(v)}" for k, v in sorted(items.items())) + "}"


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", "replace")
    return repr(value) if isinstance(value, str) else str(value)


def table_matches(table: Mapping[str, Any], headers: Mapping[str, Any]) -> bool:
    """Whether RabbitMQ's headers exchange routes a message with ``headers`` along a
    binding of ``table`` (the in-memory broker's routing, and the docs' claims)."""
    mode = str(table.get(X_MATCH, "all"))
    with_x = mode.endswith("-with-x")
    wanted = {k: v for k, v in table.items() if k != X_MATCH and (with_x or not k.startswith("x-"))}
    hits = [k in headers and _same(headers[k], v) for k, v in wanted.items()]
    return any(hits) if mode.startswith("any") else all(hits)


def _same(got: Any, want: Any) -> bool:
    if isinstance(got, (bytes, bytearray)):
        got = bytes(got).decode("utf-8", "replace")
    return type(got) is type(want) and bool(got == want)


def check_header_routing(topology: Topology) -> None:
    """A namespace routes by headers alone or by routing keys alone; a destination of
    a namespace that routes by headers binds by headers. ``ValueError`` otherwise."""
    if not topology.routes_by_headers:
        return
    intakes = [i for i in topology.intakes if i.type != "headers"]
    if intakes:
        raise ValueError(
            f"intake {intakes[0].exchange!r} is {intakes[0].type} (routes by routing key), but "
            "this namespace routes by headers (a headers intake, or a destination with "
            "headers): a namespace routes by one or the other; give each intake a namespace "
            "of its own"
        )
    for dest in topology.destinations:
        if dest.bindings:
            raise ValueError(
                f"destination {dest.queue!r} binds routing keys in a namespace that routes by "
                "headers (a headers intake, or a destination with headers): each message would "
                f"also reach {topology.unrouted} through the headers exchange; bind it by "
                "headers, or give it a namespace of its own"
            )
    if topology.external_bindings:
        raise ValueError(
            "external_bindings name routing keys, but this namespace routes by headers: bind "
            f"your own queues and exchanges to {topology.headers_exchange} with header "
            "arguments by hand, and leave external_bindings out"
        )
