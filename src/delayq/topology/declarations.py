"""Pure builder: a topology becomes an ordered list of declarations.

Order matters: exchanges, then queues, then bindings, and ``<ns>.ready``
before any tier queue that dead-letters into it (at-least-once dead-lettering
into a missing exchange holds messages and retries only every few minutes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from delayq.topology import marker
from delayq.topology.cascade import Kind, delivery_binding_key, level_binding_keys
from delayq.topology.headers import table_text
from delayq.topology.model import QueueType, Topology
from delayq.topology.shards import LEADER_LOCATOR

__all__ = [
    "PARKED_DELIVERY_LIMIT",
    "ArgumentValue",
    "BindingDecl",
    "Declaration",
    "ExchangeDecl",
    "QueueDecl",
    "apply_marker",
    "build_declarations",
    "describe",
    "is_destination_entity",
    "parked_arguments",
    "rung_arguments",
]

ArgumentValue = str | int
"""x-arguments are strings or ints: pika cannot encode floats, and RabbitMQ treats
``1000.0`` as inequivalent to ``1000``."""


@dataclass(frozen=True)
class ExchangeDecl:
    name: str
    type: str
    arguments: Mapping[str, ArgumentValue] = field(default_factory=dict)
    durable: bool = True
    role: str = ""
    """``marker`` for the apply marker (see :mod:`delayq.topology.marker`), else empty."""

    @property
    def kind(self) -> str:
        return "exchange"


@dataclass(frozen=True)
class QueueDecl:
    name: str
    arguments: Mapping[str, ArgumentValue] = field(default_factory=dict)
    durable: bool = True
    role: str = ""
    """Why the queue exists (``tier``, ``retry``, ``level``, ``destination``, ``dlq``,
    ``unrouted``)."""
    legacy: tuple[Mapping[str, ArgumentValue], ...] = ()
    """Arguments an earlier delayq declared this queue with, still accepted as present by
    ``apply`` and ``verify`` (RabbitMQ cannot change a queue's arguments in place): a
    parked queue declared before :data:`PARKED_DELIVERY_LIMIT`, say."""

    def legacy_forms(self) -> tuple[QueueDecl, ...]:
        """This declaration with each of its :attr:`legacy` argument sets."""
        return tuple(
            QueueDecl(self.name, arguments, self.durable, self.role) for arguments in self.legacy
        )

    @property
    def kind(self) -> str:
        return "queue"


@dataclass(frozen=True)
class BindingDecl:
    source: str
    destination: str
    routing_key: str = ""
    destination_type: str = "queue"
    """``queue``, or ``exchange`` for an exchange-to-exchange binding (cascade levels)."""
    arguments: Mapping[str, ArgumentValue] = field(default_factory=dict)
    """A binding from the headers exchange: its x-match table (see
    :mod:`delayq.topology.headers`); empty for every other binding."""

    @property
    def kind(self) -> str:
        return "binding"

    @property
    def match(self) -> str:
        """What the binding matches: its x-match table, else its key."""
        return table_text(self.arguments) if self.arguments else self.routing_key or "(any)"

    @property
    def name(self) -> str:
        arrow = "=>" if self.destination_type == "exchange" else "->"
        return f"{self.source} {arrow} {self.destination} [{self.match}]"


Declaration = ExchangeDecl | QueueDecl | BindingDecl


def _safe_dead_lettering(queue_type: QueueType) -> dict[str, ArgumentValue]:
    if queue_type is QueueType.CLASSIC:
        # Classic queues refuse x-dead-letter-strategy (406): at-most-once only.
        return {"x-queue-type": "classic"}
    # at-least-once silently falls back to at-most-once without reject-publish.
    return {
        "x-queue-type": "quorum",
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }


PARKED_DELIVERY_LIMIT = 2_147_483_647
"""``x-delivery-limit`` of the quorum queues where messages are parked (``<queue>.dlq``,
``<ns>.unrouted``): in effect none, on every version. Browsing them returns every
message it looked at, and RabbitMQ 4.x quorum queues count each return against a
delivery limit of 20 by default: without this, the 21st ``delayq dlq list`` would
delete every parked message. ``-1`` (no limit on 4.x) drops a message at its first
return on 3.x, and no argument at all takes 4.x's 20: one high limit is the
declaration that keeps every parked message on both."""


def _parked(name: str, queue_type: QueueType, role: str) -> QueueDecl:
    """A parked queue; one an earlier delayq declared without the limit is accepted
    (browsing it on 4.x is refused instead: :class:`~delayq.errors.ParkedAtRisk`)."""
    arguments = parked_arguments(queue_type)
    legacy = ({"x-queue-type": "quorum"},) if queue_type is QueueType.QUORUM else ()
    return QueueDecl(name, arguments, role=role, legacy=legacy)


def parked_arguments(queue_type: QueueType) -> dict[str, ArgumentValue]:
    """The arguments of a queue where messages are parked (see :data:`PARKED_DELIVERY_LIMIT`)."""
    if queue_type is QueueType.CLASSIC:
        return {"x-queue-type": "classic"}  # classic queues count no deliveries
    return {"x-queue-type": "quorum", "x-delivery-limit": PARKED_DELIVERY_LIMIT}


def rung_arguments(
    queue_type: QueueType, ttl_ms: int, dead_letter_exchange: str
) -> dict[str, ArgumentValue]:
    """The arguments of a fixed-TTL queue that dead-letters into ``dead_letter_exchange``.

    No ``x-dead-letter-routing-key`` (the routing key survives) and no ``x-expires``.
    """
    return {
        **_safe_dead_lettering(queue_type),
        "x-message-ttl": ttl_ms,
        "x-dead-letter-exchange": dead_letter_exchange,
    }


def build_declarations(topology: Topology) -> tuple[Declaration, ...]:
    """Everything ``apply`` declares, in dependency order; the apply marker last."""
    decls = _entities(topology)
    return (*decls, _marker(topology, decls))


def apply_marker(topology: Topology) -> ExchangeDecl:
    """The exchange a completed apply of ``topology`` leaves (see :mod:`delayq.topology.marker`)."""
    return _marker(topology, _entities(topology))


def is_destination_entity(topology: Topology, decl: Declaration) -> bool:
    """Whether ``decl`` is a destination queue, its DLQ, a binding to one of them, or a
    retry tier's binding for one (keyed by the destination's name); or an intake's
    exchange, queue, DLQ or binding (several services may add intakes, as destinations,
    without another apply marker)."""
    names = {name for dest in topology.destinations for name in (dest.queue, dest.dlq)}
    ns = topology.namespace
    names |= {n for i in topology.intakes for n in (i.queue_name(ns), i.dlq_name(ns))}
    if isinstance(decl, BindingDecl):
        return decl.destination_type == "queue" and (
            decl.destination in names or decl.routing_key in names
        )
    if isinstance(decl, ExchangeDecl):
        return decl.name in {intake.exchange for intake in topology.intakes}
    return isinstance(decl, QueueDecl) and decl.name in names


def _marker(topology: Topology, decls: tuple[Declaration, ...]) -> ExchangeDecl:
    own = [d for d in decls if not is_destination_entity(topology, d)]
    name = marker.marker_name(topology.namespace, marker.digest(own))
    return ExchangeDecl(name, "fanout", role=marker.MARKER_ROLE)


def _entities(topology: Topology) -> tuple[Declaration, ...]:
    qtype = topology.queue_type
    ready, unrouted = topology.ready_exchange, topology.unrouted

    exchanges: list[Declaration] = [
        ExchangeDecl(unrouted, "fanout"),
        ExchangeDecl(ready, "topic", {"alternate-exchange": unrouted}),
        ExchangeDecl(topology.direct_exchange, "direct"),
    ]
    queues: list[Declaration] = [_parked(unrouted, qtype, "unrouted")]
    bindings: list[Declaration] = [BindingDecl(unrouted, unrouted)]

    # Two rungs per tier, each a fanout exchange into a fixed-TTL queue.
    # Delays dead-letter into the ready exchange; no x-dead-letter-routing-key,
    # so the destination's routing key survives. Retries, addressed by routing
    # key to the failing queue alone, dead-letter through the default exchange,
    # which routes by queue name: no other binding (not even '#') sees them.
    # No x-expires: an idle tier must never be deleted with messages in it.
    # With `shards`, a tier is several such pairs (see delayq.topology.shards); the
    # fanout retry tiers below are no one's choice any more and stay one.
    for role, names_of, dead_letter_exchange in (
        ("tier", topology.tier_shards, ready),
        ("retry", lambda tier: (topology.retry_name(tier),), ""),
    ):
        for tier in topology.ladder.tiers:
            for shard, name in enumerate(names_of(tier)):
                exchanges.append(ExchangeDecl(name, "fanout"))
                arguments = _rung(topology, shard, tier.ttl_ms, dead_letter_exchange)
                queues.append(QueueDecl(name, arguments, role=role))
                bindings.append(BindingDecl(name, name))

    # The retry tiers consumers use: a direct exchange bound by each destination's name
    # into a fixed-TTL queue that dead-letters through <ns>.direct. A routing key, or a
    # CC header's (dead-lettering keeps them), reaches this topology's queues alone: not
    # so through the fanout retry tiers above, whose queues dead-letter through the
    # default exchange to any queue of the vhost. Those stay declared for consumers of
    # earlier versions (a rolling upgrade); the consumer grant has no right on them.
    for tier in topology.ladder.tiers:
        for shard, name in enumerate(topology.retry_shards(tier)):
            exchanges.append(ExchangeDecl(name, "direct"))
            arguments = _rung(topology, shard, tier.ttl_ms, topology.direct_exchange)
            queues.append(QueueDecl(name, arguments, role="retry"))

    if topology.exact_enabled:
        _cascade(topology, exchanges, queues, bindings)
    if topology.routes_by_headers:
        _headers_exchange(topology, exchanges, bindings)

    for dest in topology.destinations:
        bindings.extend(
            BindingDecl(topology.headers_exchange, dest.queue, arguments=table)
            for table in dest.headers
        )
        if dest.existing:  # not delayq's: only bound
            bindings.extend(BindingDecl(ready, dest.queue, key) for key in dest.bindings)
            if topology.exact_enabled:
                levels, delivery = topology.exact_levels, topology.delivery_exchange
                bindings.extend(
                    BindingDecl(delivery, dest.queue, delivery_binding_key(levels, Kind.ROUTE, k))
                    for k in dest.bindings
                )
            continue
        queues.append(_parked(dest.dlq, qtype, "dlq"))
        work_args: dict[str, ArgumentValue] = {
            **_safe_dead_lettering(qtype),
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": dest.dlq,
        }
        if qtype is QueueType.QUORUM:
            work_args["x-delivery-limit"] = dest.delivery_limit
        queues.append(QueueDecl(dest.queue, work_args, role="destination"))
        bindings.extend(BindingDecl(ready, dest.queue, key) for key in dest.bindings)
        # What consumers address to one queue by name (a retry, a dead letter) goes
        # through direct exchanges that know this topology's queues alone: consumers
        # need no right on the default exchange nor on the fanout retry tiers, which
        # would let them reach any queue of the vhost (see delayq.ops.grant).
        bindings.append(BindingDecl(topology.direct_exchange, dest.queue, dest.queue))
        bindings.append(BindingDecl(topology.direct_exchange, dest.dlq, dest.dlq))
        bindings.extend(
            BindingDecl(name, name, dest.queue)
            for tier in topology.ladder.tiers
            for name in topology.retry_shards(tier)
        )
        if topology.exact_enabled:
            levels, delivery = topology.exact_levels, topology.delivery_exchange
            bindings.extend(
                BindingDecl(delivery, dest.queue, delivery_binding_key(levels, Kind.ROUTE, key))
                for key in dest.bindings
            )
            # Retries addressed to this queue alone: no binding key of a destination
            # matches a `q.` target, since theirs all sit behind `r.`.
            address = delivery_binding_key(levels, Kind.ADDRESS, dest.queue)
            bindings.append(BindingDecl(delivery, dest.queue, address))

    _intakes(topology, exchanges, queues, bindings)
    return (*exchanges, *queues, *bindings)


def _intakes(
    topology: Topology,
    exchanges: list[Declaration],
    queues: list[Declaration],
    bindings: list[Declaration],
) -> None:
    """Each intake (:mod:`delayq.topology.intakes`): its exchange, a fanout, into its
    quorum queue, which dead-letters a message returned ``delivery_limit`` times to its
    DLQ; the DLQ bound to ``<ns>.direct`` by its name, where the bridge parks."""
    qtype, ns = topology.queue_type, topology.namespace
    for intake in topology.intakes:
        queue, dlq = intake.queue_name(ns), intake.dlq_name(ns)
        exchanges.append(ExchangeDecl(intake.exchange, "fanout"))
        arguments: dict[str, ArgumentValue] = {
            **_safe_dead_lettering(qtype),
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": dlq,
        }
        if qtype is QueueType.QUORUM:
            arguments["x-delivery-limit"] = intake.delivery_limit
        queues.append(_parked(dlq, qtype, "intake-dlq"))
        queues.append(QueueDecl(queue, arguments, role="intake"))
        bindings.append(BindingDecl(intake.exchange, queue))
        bindings.append(BindingDecl(topology.direct_exchange, dlq, dlq))


def _headers_exchange(
    topology: Topology, exchanges: list[Declaration], bindings: list[Declaration]
) -> None:
    """The headers exchange (:mod:`delayq.topology.headers`): every due message of the
    ready exchange (``#``) and every cascade route of the delivery exchange (never a
    ``q.`` retry address) reaches it; what no table matches goes to ``<ns>.unrouted``,
    since the ready exchange's own alternate never fires past a ``#`` binding."""
    name = topology.headers_exchange
    exchanges.append(ExchangeDecl(name, "headers", {"alternate-exchange": topology.unrouted}))
    bindings.append(BindingDecl(topology.ready_exchange, name, "#", destination_type="exchange"))
    if topology.exact_enabled:
        key = delivery_binding_key(topology.exact_levels, Kind.ROUTE, "#")
        bindings.append(
            BindingDecl(topology.delivery_exchange, name, key, destination_type="exchange")
        )


def _rung(
    topology: Topology, shard: int, ttl_ms: int, dead_letter_exchange: str
) -> dict[str, ArgumentValue]:
    """A tier's or retry tier's queue arguments: shard 0 keeps the unsharded ones;
    on quorum queues the others let the cluster place their leaders."""
    arguments = rung_arguments(topology.queue_type, ttl_ms, dead_letter_exchange)
    if topology.tier_max_length is not None:
        arguments["x-max-length"] = topology.tier_max_length
    if shard > 0 and topology.queue_type is QueueType.QUORUM:
        arguments.update(LEADER_LOCATOR)
    return arguments


def _cascade(
    topology: Topology,
    exchanges: list[Declaration],
    queues: list[Declaration],
    bindings: list[Declaration],
) -> None:
    """The exact strategy's levels (see :mod:`delayq.topology.cascade`).

    Level k: a topic exchange whose keys with bit k set go to its queue (TTL 2**k
    units, dead-lettering to level k-1) and the others straight on to level k-1's
    exchange; level 0 hands over to the delivery exchange, where destinations bind
    behind the bits. Every hop goes one level down: no dead-letter cycle.
    """
    qtype, levels = topology.queue_type, topology.exact_levels
    delivery = topology.delivery_exchange
    exchanges.append(ExchangeDecl(delivery, "topic", {"alternate-exchange": topology.unrouted}))
    for level in range(levels):
        name = topology.level_name(level)
        below = delivery if level == 0 else topology.level_name(level - 1)
        exchanges.append(ExchangeDecl(name, "topic"))
        arguments = rung_arguments(qtype, topology.exact_unit_ms * 2**level, below)
        if topology.tier_max_length is not None:
            arguments["x-max-length"] = topology.tier_max_length
        queues.append(QueueDecl(name, arguments, role="level"))
        set_key, clear_key = level_binding_keys(level, levels)
        bindings.append(BindingDecl(name, name, set_key))
        bindings.append(BindingDecl(name, below, clear_key, destination_type="exchange"))


def describe(decl: Declaration) -> str:
    """One line for ``delayq topology plan``."""
    if isinstance(decl, ExchangeDecl):
        args = _format_args(decl.arguments)
        role = f" [{decl.role}]" if decl.role else ""
        return f"exchange {decl.name}{role} ({decl.type}{', ' + args if args else ''})"
    if isinstance(decl, QueueDecl):
        return f"queue    {decl.name} [{decl.role}] ({_format_args(decl.arguments)})"
    arrow = "=>" if decl.destination_type == "exchange" else "->"
    what = f"headers={decl.match}" if decl.arguments else f"key={decl.match}"
    return f"binding  {decl.source} {arrow} {decl.destination} {what}"


def _format_args(arguments: Mapping[str, ArgumentValue]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in arguments.items())
