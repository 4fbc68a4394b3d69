"""Least-privilege RabbitMQ permissions for the three roles of one namespace.

RabbitMQ grants each user, per vhost, three regular expressions matched against
exchange and queue names (the default exchange is called ``amq.default``):

- ``configure``: declare and delete (``exchange.declare``, ``queue.declare``,
  ``queue.delete``);
- ``write``: publish to an exchange, bind *to* a queue, be named as a
  dead-letter or alternate exchange in a declaration;
- ``read``: consume or get from a queue, bind *from* an exchange, declare a
  queue that dead-letters or an exchange that has an alternate exchange.

A passive declare needs no permission up to RabbitMQ 4.2.5; 4.2.6 and 4.3.0 required
``configure`` for it, and later releases (4.3.6 here) accept any of the three permissions
on the name (rabbitmq-server #16085, #16272). So each role is granted ``write`` on every
name it checks and does not otherwise use: the apply marker (a fanout exchange bound to
nothing: a message published to it goes nowhere) and, for a consumer, the DLQs (a queue:
``write`` binds *to* it, which also needs ``read`` on an exchange, and a consumer reads
no exchange). What each role does, read from the code:

- a **producer** (``Publisher``, ``AsyncPublisher``) publishes to the tier
  exchanges ``<ns>.tier.<label>`` and, for delay 0, to ``<ns>.ready``; it checks
  the apply marker ``<ns>.applied.<digest>`` with a passive declare and never declares
  anything;
- a **consumer** (``Consumer``, ``AsyncConsumer``, ``delayq worker``) consumes its
  destination queues and republishes retries to ``<ns>.retry.<label>.direct``,
  immediate retries and dead letters to ``<ns>.direct``: direct exchanges bound
  by queue name to this topology's queues and DLQs alone. It declares nothing:
  refused the configure permission, it checks with passive declares that the
  topology exists instead of applying it (:func:`consumer_checks`: the apply marker,
  its queues and DLQs, the exchanges it writes to). It needs no write on the default
  exchange, nor on a retry tier's fanout ``<ns>.retry.<label>`` (whose queue
  dead-letters through the default exchange by routing key): either would let
  it put a message in any queue of the vhost, another namespace's included;
- an **admin** (``delayq topology apply``) declares every exchange, queue and
  binding of the namespace and of the topology's destination queues and DLQs.
  Declaring the retry and destination queues, which dead-letter through the
  default exchange, needs write on ``amq.default``: the admin is an operator's
  user, not an application's.

>>> from delayq.topology.model import Topology
>>> grant = producer_grant(Topology(namespace="shop"), "app")
>>> grant.permissions.write
'^(?:shop\\\\.ready|shop\\\\.tier\\\\.[0-9hms]+|shop\\\\.applied\\\\.[0-9a-f]+)$'
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from delayq.errors import InvalidInput
from delayq.topology.declarations import ExchangeDecl, QueueDecl, build_declarations
from delayq.topology.marker import MARKER_ROLE
from delayq.topology.model import Strategy, Topology
from delayq.topology.shards import SHARD_SUFFIX_PATTERN

__all__ = [
    "NOTHING",
    "Grant",
    "Permissions",
    "Role",
    "admin_grant",
    "bridge_grant",
    "consumer_checks",
    "consumer_grant",
    "grants_for",
    "producer_grant",
]

NOTHING = "^$"
"""The regex that matches no exchange or queue (RabbitMQ reads ``""`` the same way)."""

_LABEL = "[0-9hms]+"
"""A tier label (``30s``, ``1h30m``, ``500ms``): a ladder change needs no new grant."""


class Role(str, enum.Enum):
    PRODUCER = "producer"
    """Publishes delayed and immediate messages."""
    CONSUMER = "consumer"
    """Consumes destination queues, retries and dead-letters; declares nothing."""
    ADMIN = "admin"
    """Applies the topology (``delayq topology apply``)."""
    BRIDGE = "bridge"
    """Runs ``delayq bridge``: consumes the intake queues, schedules into the tiers, parks
    in the intakes' DLQs. Without one, the producer may run the bridge too."""


@dataclass(frozen=True)
class Permissions:
    """One user's regexes on one vhost, as ``rabbitmqctl set_permissions`` takes them."""

    configure: str
    write: str
    read: str


@dataclass(frozen=True)
class Grant:
    """What one user of one role may do, and why."""

    role: Role
    user: str
    vhost: str
    permissions: Permissions
    reasons: tuple[str, ...]
    """One line per permission: what needs it."""

    def rabbitmqctl_args(self) -> list[str]:
        """Arguments of ``rabbitmqctl`` that set these permissions."""
        p = self.permissions
        return ["set_permissions", "-p", self.vhost, self.user, p.configure, p.write, p.read]

    def management_body(self) -> dict[str, str]:
        """The body of ``PUT /api/permissions/<vhost>/<user>``."""
        p = self.permissions
        return {"configure": p.configure, "write": p.write, "read": p.read}


def _escape(name: str) -> str:
    # Names are letters, digits, '.', '_' and '-' (the topology model checks):
    # only '.' means something in a regex.
    return name.replace(".", r"\.")


def _pattern(alternatives: list[str]) -> str:
    if not alternatives:
        return NOTHING
    return "^(?:" + "|".join(alternatives) + ")$"


def _names(topology: Topology) -> dict[str, str]:
    ns = _escape(topology.namespace)
    # Shards (`.s1`, ...) only when the topology has them: an unsharded grant is unchanged.
    shard = SHARD_SUFFIX_PATTERN if topology.shards > 1 else ""
    return {
        "ready": f"{ns}\\.ready",
        "unrouted": f"{ns}\\.unrouted",
        "direct": f"{ns}\\.direct",
        "tier": f"{ns}\\.tier\\.{_LABEL}{shard}",
        "retry": f"{ns}\\.retry\\.{_LABEL}",
        "retry_direct": f"{ns}\\.retry\\.{_LABEL}\\.direct{shard}",
        "rungs": f"{ns}\\.(?:tier|retry)\\.{_LABEL}{shard}",
        "levels": f"{ns}\\.level\\.[0-9]+",
        "cascade": f"{ns}\\.(?:level\\.[0-9]+|delivery)",
        "headers": f"{ns}\\.headers",
        "marker": f"{ns}\\.applied\\.[0-9a-f]+",  # see delayq.topology.marker: applies declare it
        "probe": f"{ns}\\.verify\\.[0-9a-f]+(?:\\.in)?",  # topology verify's probe and inbox
    }


def _intakes(topology: Topology) -> tuple[list[str], list[str], list[str]]:
    """The intakes' exchanges, queues and DLQs (:mod:`delayq.topology.intakes`)."""
    ns = topology.namespace
    return (
        [_escape(i.exchange) for i in topology.intakes],
        [_escape(i.queue_name(ns)) for i in topology.intakes],
        [_escape(i.dlq_name(ns)) for i in topology.intakes],
    )


def _cascade(topology: Topology, names: dict[str, str]) -> list[str]:
    """The exact strategy's levels and delivery exchange, when the topology has them."""
    return [names["cascade"]] if topology.exact_enabled else []


def producer_grant(
    topology: Topology, user: str, vhost: str | None = None, *, bridges: bool = True
) -> Grant:
    """Publish to the tier exchanges and the ready exchange; with intakes, also publish to
    the intakes' exchanges (plugin-style publishers) and, unless ``bridges`` is false (a
    :func:`bridge_grant` user runs it), run their bridge (consume the intake queues, park
    in their DLQs through ``<ns>.direct``); nothing else."""
    n = _names(topology)
    exchanges, intake_queues, _dlqs = _intakes(topology)
    queues = intake_queues if bridges else []
    bridge = [n["direct"]] if queues else []
    intakes = ", ".join(i.exchange for i in topology.intakes)
    return Grant(
        role=Role.PRODUCER,
        user=user,
        vhost=vhost or topology.vhost,
        permissions=Permissions(
            configure=NOTHING,
            write=_pattern(
                [n["ready"], n["tier"], *_cascade(topology, n), *exchanges, *bridge, n["marker"]]
            ),
            read=_pattern(queues),
        ),
        reasons=(
            "configure: nothing (a producer only checks the apply marker with a passive "
            "declare)",
            f"write: publish to the tier exchanges {topology.namespace}.tier.<label> and, "
            f"for delay 0, to {topology.ready_exchange}"
            + (
                f", and to the cascade levels {topology.namespace}.level.<k>"
                if topology.exact_enabled
                else ""
            )
            + (
                f"; to the intakes ({intakes}), and to {topology.direct_exchange}, where "
                "the bridge parks what it cannot schedule (a --bridge-user keeps this "
                "user to the tiers and intakes)"
                if queues
                else f"; to the intakes ({intakes})"
                if exchanges
                else ""
            )
            + f"; and {topology.namespace}.applied.<digest>, the apply marker it checks "
            "(RabbitMQ 4.2.6+ refuses a passive declare to a user with no permission on the "
            "name; the marker is bound to nothing)",
            (
                "read: the intake queues, which delayq bridge (run as this user) consumes"
                if queues
                else "read: nothing (a producer never consumes or gets)"
            ),
        ),
    )


def bridge_grant(topology: Topology, user: str, vhost: str | None = None) -> Grant:
    """Run ``delayq bridge``: consume the intake queues, publish what they hold into the
    tiers (or ready, or the cascade), park what cannot be scheduled in the intakes' DLQs
    through ``<ns>.direct``; no intake exchange, nothing else."""
    n = _names(topology)
    _exchanges, queues, _dlqs = _intakes(topology)
    if not queues:
        raise InvalidInput(
            f"namespace {topology.namespace!r} declares no intakes: there is no bridge to "
            "grant (leave out --bridge-user)"
        )
    return Grant(
        role=Role.BRIDGE,
        user=user,
        vhost=vhost or topology.vhost,
        permissions=Permissions(
            configure=NOTHING,
            write=_pattern(
                [n["ready"], n["tier"], *_cascade(topology, n), n["direct"], n["marker"]]
            ),
            read=_pattern(queues),
        ),
        reasons=(
            "configure: nothing (the bridge checks the apply marker with a passive declare)",
            f"write: schedule into the tier exchanges {topology.namespace}.tier.<label> "
            f"(delay 0: {topology.ready_exchange}"
            + (
                f"; the cascade levels {topology.namespace}.level.<k>"
                if topology.exact_enabled
                else ""
            )
            + f"), park in the intakes' DLQs through {topology.direct_exchange}, and the "
            f"apply marker {topology.namespace}.applied.<digest> it checks",
            "read: consume the intake queues",
        ),
    )


def consumer_grant(topology: Topology, user: str, vhost: str | None = None) -> Grant:
    """Consume the destination queues, republish retries and dead letters; declare nothing."""
    n = _names(topology)
    queues = [_escape(d.queue) for d in topology.destinations]
    # Retries follow the topology's strategy: a retry tier, or a cascade level.
    exact = topology.strategy is Strategy.EXACT
    retries = [n["levels"]] if exact else [n["retry_direct"]]
    dlqs = [_escape(d.dlq) for d in topology.destinations if not d.existing]
    return Grant(
        role=Role.CONSUMER,
        user=user,
        vhost=vhost or topology.vhost,
        permissions=Permissions(
            configure=NOTHING,
            write=_pattern([n["direct"], *retries, n["marker"], *dlqs]),
            read=_pattern(queues),
        ),
        reasons=(
            "configure: nothing (consumers check the topology with passive declares; the "
            "admin applies it): no declare, and no delete of tiers, retries or ready",
            "write: republish retries to "
            + (
                f"the cascade levels {topology.namespace}.level.<k>"
                if exact
                else f"{topology.namespace}.retry.<label>.direct"
            )
            + f", immediate retries and dead letters to {topology.direct_exchange}: direct "
            "exchanges that route this topology's queue names only. Not the default exchange "
            "nor the retry tiers' fanouts, through which any queue of the vhost is reached; "
            f"and the apply marker {topology.namespace}.applied.<digest> and the DLQs, which "
            "it checks with passive declares (RabbitMQ 4.2.6+ refuses those to a user with no "
            "permission on the name; the marker is bound to nothing, and binding to a DLQ "
            "also needs read on an exchange, which a consumer has on none)",
            "read: consume the destination queues",
        ),
    )


def admin_grant(topology: Topology, user: str, vhost: str | None = None) -> Grant:
    """Apply the topology: declare and bind every entity of the namespace."""
    n = _names(topology)
    queues = [_escape(d.queue) for d in topology.destinations]
    dlqs = [_escape(d.dlq) for d in topology.destinations if not d.existing]
    cascade = _cascade(topology, n)  # levels: exchange-to-exchange binds need write and read
    direct = [n["direct"], n["retry_direct"]]
    intake_exchanges, intake_queues, intake_dlqs = _intakes(topology)
    # The headers exchange: bound to from <ns>.ready (write), bound from (read).
    headers = [n["headers"]] if topology.routes_by_headers else []
    entities = [n["ready"], n["unrouted"], *direct, n["rungs"], *cascade, *headers, n["marker"]]
    entities += [*queues, *dlqs, *intake_exchanges, *intake_queues, *intake_dlqs, n["probe"]]
    write = ["amq\\.default", n["ready"], n["unrouted"], *direct, n["rungs"], *cascade]
    write += [*headers, *queues, *dlqs, *intake_queues, *intake_dlqs, n["probe"]]
    read = [n["ready"], n["unrouted"], *direct, n["rungs"], *cascade, *headers, *queues]
    read += [*intake_exchanges, *intake_queues, n["probe"]]
    return Grant(
        role=Role.ADMIN,
        user=user,
        vhost=vhost or topology.vhost,
        permissions=Permissions(
            configure=_pattern(entities), write=_pattern(write), read=_pattern(read)
        ),
        reasons=(
            "configure: declare every exchange and queue of the namespace (the apply "
            "marker included) and the destination queues with their DLQs; `topology "
            "verify`'s probe queue and inbox (<ns>.verify.<hex>, deleted after)",
            "write: bind the tier, retry, unrouted, destination and DLQ queues; name the "
            f"ready, {topology.direct_exchange} and default (amq.default) exchanges as "
            "dead-letter exchanges of new queues and the unrouted exchange as the alternate "
            "exchange",
            "read: bind from the ready, direct, tier, retry and unrouted exchanges; declare "
            "the queues that dead-letter and the ready exchange with its alternate exchange",
        ),
    )


def grants_for(
    topology: Topology,
    *,
    producer: str | None,
    consumer: str | None,
    admin: str | None = None,
    vhost: str | None = None,
    bridge: str | None = None,
) -> list[Grant]:
    """The grants for whichever users are given: producer, consumer, admin, then bridge
    (the producer then runs no bridge).

    One user per role: RabbitMQ keeps one set of permissions per user and vhost, so
    a second role's would silently replace the first's.
    """
    given = [
        (role, user)
        for role, user in (
            ("producer", producer),
            ("consumer", consumer),
            ("admin", admin),
            ("bridge", bridge),
        )
        if user is not None
    ]
    for index, (role, user) in enumerate(given):
        for other_role, other in given[index + 1 :]:
            if user == other:
                raise InvalidInput(
                    f"user {user!r} is given two roles ({role} and {other_role}): RabbitMQ "
                    "keeps one set of permissions per user and vhost, so the second would "
                    "replace the first; use one user per role"
                )
    grants = []
    if producer is not None:
        grants.append(producer_grant(topology, producer, vhost, bridges=bridge is None))
    if consumer is not None:
        grants.append(consumer_grant(topology, consumer, vhost))
    if admin is not None:
        grants.append(admin_grant(topology, admin, vhost))
    if bridge is not None:
        grants.append(bridge_grant(topology, bridge, vhost))
    return grants


def consumer_checks(topology: Topology) -> list[ExchangeDecl | QueueDecl]:
    """What a consumer refused the configure permission checks with passive declares: the
    apply marker (the namespace's exchanges and queues, as applied, with their arguments),
    its destination queues and DLQs, and the exchanges it writes to. Each is a name the
    consumer grant gives a permission on, so the check passes on RabbitMQ 4.2.6+ too."""
    grant = consumer_grant(topology, "consumer").permissions
    allowed = [re.compile(p) for p in (grant.write, grant.read)]
    return [
        decl
        for decl in build_declarations(topology)
        if isinstance(decl, (ExchangeDecl, QueueDecl))
        and (decl.role == MARKER_ROLE or any(p.fullmatch(decl.name) for p in allowed))
    ]
