"""Intakes: where publishers written for the delayed-message-exchange plugin keep
publishing, unchanged (the plugin exchange's name, an ``x-delay`` header in ms).

>>> from delayq import Topology
>>> topo = Topology(namespace="shop", ladder=["1s", "5s"],
...                 destinations=[{"queue": "emails", "bindings": ["email.welcome"]}],
...                 intakes=[{"exchange": "delayed", "type": "direct"}])
>>> topo.intakes[0].queue_name(topo.namespace)
'shop.intake.delayed'

An intake declares the exchange publishers address (a fanout: every message, whatever
its routing key) into a quorum queue, ``<ns>.intake.<exchange>``, which the bridge
(:mod:`delayq.intake`, ``delayq bridge``) consumes: each message is published into the
tier its ``x-delay`` asks for (or the exact cascade), with its routing key, headers,
properties and body, confirmed before it is acked; what cannot be scheduled goes to
``<ns>.intake.<exchange>.dlq`` with the reason. When due, a message is routed by the
namespace's ready exchange (a topic exchange), as the plugin routed it by its
``x-delayed-type``: a ``direct`` intake's destinations bind exact keys (no wildcard,
which the topic exchange would read as a pattern), a ``fanout`` intake's bind ``#``,
and a ``headers`` intake's bind x-match tables (``headers:``) on the namespace's headers
exchange ``<ns>.headers``, which the ready exchange feeds every message
(:mod:`delayq.topology.headers`); such a namespace routes by headers alone. Its
publishers may send an empty routing key, as headers-exchange publishers often do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import ConfigDict, Field, field_validator

from delayq.topology._validation import MAX_NAME_BYTES, Model, check_name, shown
from delayq.topology.cascade import Strategy

if TYPE_CHECKING:
    from delayq.topology.model import Topology

__all__ = ["INTAKE_TYPES", "Intake", "check_intakes"]

INTAKE_TYPES = ("direct", "topic", "fanout", "headers")
"""The plugin's ``x-delayed-type`` values an intake reproduces."""


class Intake(Model):
    """An exchange plugin-style publishers publish to, with ``x-delay`` headers."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    exchange: str
    """The name publishers publish to: the plugin exchange's."""
    type: str = "direct"
    """The plugin exchange's ``x-delayed-type``: how a due message is routed."""
    strategy: Strategy | None = None
    """``tiered`` (the smallest tier at or above the delay) or ``exact``; ``None``: the
    topology's default."""
    delivery_limit: int = Field(default=20, ge=1, le=1000)
    """Returns of a message to the intake queue (a bridge that crashed on it) before the
    broker dead-letters it to the intake's DLQ."""

    @field_validator("exchange")
    @classmethod
    def _exchange(cls, value: str) -> str:
        return check_name(value, "intake exchange")

    @field_validator("type")
    @classmethod
    def _type(cls, value: str) -> str:
        if value not in INTAKE_TYPES:
            raise ValueError(
                f"intake type must be the plugin exchange's x-delayed-type, one of "
                f"{', '.join(INTAKE_TYPES)}; not {value!r}"
            )
        return value

    def queue_name(self, namespace: str) -> str:
        """The quorum queue the bridge consumes."""
        return f"{namespace}.intake.{self.exchange}"

    def dlq_name(self, namespace: str) -> str:
        """Where the bridge parks what it cannot schedule (a bad ``x-delay``...)."""
        return f"{self.queue_name(namespace)}.dlq"


# What delayq declares under a namespace, by name prefix: tiers, retry tiers, the exact
# cascade's levels, intake queues, the apply marker (topology/marker.py) and the probes
# of ``topology verify`` (ops/verify_probe.py, outside this package: not imported).
_PREFIXES = {
    "tier": "its tiers",
    "retry": "its retry tiers",
    "level": "the exact cascade's levels",
    "intake": "its intake queues",
    "applied": "its apply markers",
    "verify": "the probes of topology verify",
}


def _declared_by_delayq(topology: Topology, name: str) -> str:
    """What ``name`` is among the entities delayq declares under the namespace, or ``""``:
    only those are refused, so ``orders.delayed.intake`` in namespace ``orders`` (the
    plugin guide's example) is taken."""
    namespace = topology.namespace
    if name == namespace:
        return "the namespace itself"
    exact = {
        topology.ready_exchange: "its ready exchange",
        topology.unrouted: "its unrouted exchange",
        topology.headers_exchange: "its headers exchange",
        topology.direct_exchange: "its direct exchange",
        topology.delivery_exchange: "the exact cascade's delivery exchange",
    }
    if name in exact:
        return exact[name]
    for prefix, what in _PREFIXES.items():
        if name.startswith(f"{namespace}.{prefix}."):
            return f"{namespace}.{prefix}.*: {what}"
    return ""


def check_intakes(topology: Topology) -> None:
    """The intakes fit the topology: unique, not one of delayq's names, names within
    RabbitMQ's limit, and the destinations bound the way the intake's type routes.
    Raises ``ValueError`` (the model makes it :class:`~delayq.errors.InvalidTopology`)."""
    seen: set[str] = set()
    namespace = topology.namespace
    keys = [key for dest in topology.destinations for key in dest.bindings]
    keys += list(topology.external_bindings)
    for intake in topology.intakes:
        name = intake.exchange
        if name in seen:
            raise ValueError(f"intake exchange {name!r} is listed twice")
        seen.add(name)
        taken = _declared_by_delayq(topology, name)
        if taken:
            raise ValueError(
                f"intake exchange {name!r} is a name delayq declares in namespace "
                f"{namespace!r} ({taken}): give the intake a name of its own"
            )
        dlq = intake.dlq_name(namespace)
        if len(dlq.encode("utf-8")) > MAX_NAME_BYTES:
            raise ValueError(
                f"intake exchange {shown(name)} makes the queue name {shown(dlq)}, "
                f"{len(dlq.encode('utf-8'))} bytes long; RabbitMQ takes names of up to "
                f"{MAX_NAME_BYTES} bytes"
            )
        if intake.type == "direct":
            patterns = [key for key in keys if {"*", "#"} & set(key.split("."))]
            if patterns:
                raise ValueError(
                    f"intake {name!r} is direct (routes by exact key), but binding key "
                    f"{patterns[0]!r} is a pattern, which the namespace's ready exchange (a "
                    "topic exchange) would match as one: bind exact keys, or make the "
                    "intake type: topic if the plugin exchange was one"
                )
        if intake.type == "fanout":
            narrow = [dest.queue for dest in topology.destinations if "#" not in dest.bindings]
            if narrow:
                raise ValueError(
                    f"intake {name!r} is fanout (every message reaches every queue bound to "
                    f"it, whatever its routing key), but destination {narrow[0]!r} does not "
                    "bind '#': bind it with '#'"
                )
