"""Where a delay goes: delayq's one routing home (pure, no I/O).

A :class:`Router` answers, for one topology, every question about a delay: the
exchange and wire routing key of a message to the destinations
(:meth:`Router.to_destinations`, used by the publishers and bulk planning) or of
a retry to one queue alone (:meth:`Router.to_queue`, used by the delivery
planner), and how long it really waits and under which label (:meth:`Router.wait`,
used by retry plans, bulk rejections and the CLI). Both strategies live here:

* **tiered**: one hop into the smallest tier at or above the delay (label: the
  tier's, e.g. ``"5m"``), into the shard the message id picks when the topology
  has ``shards`` (:meth:`Router.shard`);
* **exact**: the binary cascade, ``popcount(units)`` hops (label: ``"exact"``;
  the hops are :attr:`Wait.hops`).

A delay of 0 is immediate (label ``None``, shown as ``"immediate"``). A delay no
tier (or cascade) can hold raises :class:`~delayq.errors.DelayTooLong`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from delayq.durations import format_ms
from delayq.errors import InvalidInput, InvalidRoutingKey
from delayq.topology.cascade import MAX_KEY_BYTES, Kind, Strategy, plan_cascade
from delayq.topology.ladder import Ladder, Tier
from delayq.topology.model import Topology
from delayq.topology.shards import shard_of

__all__ = ["EXACT_LABEL", "IMMEDIATE", "Route", "Router", "Wait", "exact_wait", "tier_wait"]

EXACT_LABEL = "exact"
"""The label of every wait through the cascade (its ``x-delayq-tier`` header)."""


@dataclass(frozen=True, slots=True)
class Wait:
    """How a message waits: strategy, label (``None``: immediate), ms, hops."""

    strategy: Strategy
    label: str | None
    ms: int
    """The time actually waited: the tier's TTL, or the cascade's whole units."""
    hops: int
    """Queues it waits in: 1 for a tier, ``popcount(units)`` for the cascade."""

    @property
    def shown(self) -> str:
        """The label as tables print it: ``"immediate"`` for no wait."""
        return "immediate" if self.label is None else self.label

    @classmethod
    def of_tier(cls, tier: Tier | None) -> Wait:
        if tier is None:
            return IMMEDIATE
        return cls(Strategy.TIERED, tier.label, tier.ttl_ms, 1)


IMMEDIATE = Wait(Strategy.TIERED, None, 0, 0)


class Route(NamedTuple):
    """Where one message is published, and how it waits there."""

    exchange: str
    routing_key: str
    """The key on the wire (a cascade key carries the target after its bits)."""
    wait: Wait


_new_route = tuple.__new__
"""Builds a :class:`Route` without NamedTuple's Python-level ``__new__``."""


def tier_wait(ladder: Ladder, delay_ms: int) -> Wait:
    """The tiered wait of ``delay_ms`` on ``ladder``."""
    return Wait.of_tier(ladder.select_ms(delay_ms))


def exact_wait(unit_ms: int, levels: int, delay_ms: int) -> Wait:
    """The cascade's wait of ``delay_ms`` (``levels`` levels of ``unit_ms``)."""
    plan = plan_cascade(delay_ms, unit_ms, levels, Kind.ADDRESS, "")
    if plan is None:
        return Wait(Strategy.EXACT, None, 0, 0)
    return Wait(Strategy.EXACT, EXACT_LABEL, plan.wait_ms, plan.hops)


class Router:
    """Every routing decision of one topology (see the module docstring)."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        # Per tier, computed once for the hot path: the shards' exchanges, and the wait.
        self._shards = topology.shards
        self._tiers: dict[Tier | None, tuple[tuple[str, ...], Wait]] = {
            tier: (topology.tier_shards(tier), Wait.of_tier(tier)) for tier in topology.ladder.tiers
        }
        self._tiers[None] = ((topology.ready_exchange,) * self._shards, IMMEDIATE)
        self._exact_default = topology.strategy is Strategy.EXACT
        self._select_tier = topology.ladder.select_ms

    def strategy(self, requested: object = None) -> Strategy:
        """A publish's strategy: ``None`` is the topology's default; ``exact`` needs
        the topology's levels. Raises :class:`~delayq.errors.InvalidInput`."""
        topology = self.topology
        if requested is None:
            return topology.strategy
        try:
            chosen = Strategy(requested)
        except ValueError:
            raise InvalidInput(f"unknown strategy {requested!r}; use 'tiered' or 'exact'") from None
        if chosen is Strategy.EXACT and not topology.exact_enabled:
            raise InvalidInput(
                f"namespace {topology.namespace!r} has no exact levels: set `exact:` (unit, "
                "levels) or `strategy: exact` in its topology and apply it"
            )
        return chosen

    def wait(self, delay_ms: int, strategy: Strategy | None = None) -> Wait:
        """How ``delay_ms`` is waited out by ``strategy`` (default: the topology's)."""
        topology = self.topology
        if (strategy or topology.strategy) is Strategy.EXACT:
            return exact_wait(topology.exact_unit_ms, topology.exact_levels, delay_ms)
        return tier_wait(topology.ladder, delay_ms)

    def longest(self) -> tuple[int, str]:
        """The longest wait the topology's default strategy offers, and how to say it."""
        topology = self.topology
        if topology.strategy is Strategy.EXACT:
            limit = (2**topology.exact_levels - 1) * topology.exact_unit_ms
            return limit, f"the exact strategy's maximum {format_ms(limit)}"
        return topology.ladder.max_ms, f"the largest tier {topology.ladder.tiers[-1].label}"

    def shard(self, message_id: str) -> int:
        """The shard ``message_id`` waits in, in every tier (see
        :mod:`delayq.topology.shards`); always 0 without ``shards``."""
        if self._shards == 1:
            return 0
        if not message_id:
            raise InvalidInput(
                f"namespace {self.topology.namespace!r} spreads its tiers over "
                f"{self._shards} shards by message id: pass the message's id to route it"
            )
        return shard_of(message_id, self._shards)

    def to_destinations(
        self,
        delay_ms: int,
        routing_key: str,
        strategy: Strategy | None = None,
        message_id: str = "",
    ) -> Route:
        """A message for the queues bound to ``routing_key``: into the smallest tier at
        or above the delay (its shard for ``message_id``) or the cascade, to
        ``<ns>.ready`` when immediate. ``message_id`` may be left out without shards."""
        if strategy is Strategy.EXACT or (strategy is None and self._exact_default):
            return self._exact(delay_ms, Kind.ROUTE, routing_key)
        exchanges, wait = self._tiers[self._select_tier(delay_ms)]
        exchange = exchanges[0] if self._shards == 1 else exchanges[self.shard(message_id)]
        return _new_route(Route, (exchange, routing_key, wait))  # the publish hot path

    def to_queue(self, delay_ms: int, queue: str, message_id: str = "") -> Route:
        """A retry for ``queue`` alone, by the topology's default strategy: addressed by
        the queue's name through a direct exchange that routes only the topology's
        queue names (to the retry tier's shard for ``message_id``, or for delay 0
        straight back; shard 0 without an id), or through the cascade with a
        ``q.<queue>`` key only that queue's binding matches."""
        topology = self.topology
        if topology.strategy is Strategy.EXACT:
            route = self._exact(delay_ms, Kind.ADDRESS, queue)
            if not route.exchange:  # immediate: this queue alone, as below
                return Route(topology.direct_exchange, queue, route.wait)
            return route
        tier = topology.ladder.select_ms(delay_ms)
        if tier is None:
            return Route(topology.direct_exchange, queue, IMMEDIATE)
        # A delivery without an id (a foreign publisher's) retries through shard 0.
        exchange = topology.retry_shards(tier)[shard_of(message_id, self._shards)]
        return Route(exchange, queue, Wait.of_tier(tier))

    def _exact(self, delay_ms: int, kind: Kind, target: str) -> Route:
        """Through the cascade. Immediate (0 ms) goes as in the tiered strategy: to
        ``<ns>.ready`` for a route, through the default exchange for a queue address.
        Raises :class:`~delayq.errors.InvalidRoutingKey` when the key would pass 255 bytes."""
        topology = self.topology
        plan = plan_cascade(delay_ms, topology.exact_unit_ms, topology.exact_levels, kind, target)
        if plan is None:
            exchange = "" if kind is Kind.ADDRESS else topology.ready_exchange
            return Route(exchange, target, Wait(Strategy.EXACT, None, 0, 0))
        if len(plan.routing_key.encode("utf-8")) > MAX_KEY_BYTES:
            raise InvalidRoutingKey(
                f"routing key {target[:40]!r}... is too long for the exact strategy: the "
                f"cascade adds {len(plan.routing_key.encode()) - len(target.encode())} bytes "
                f"and AMQP allows {MAX_KEY_BYTES}"
            )
        wait = Wait(Strategy.EXACT, EXACT_LABEL, plan.wait_ms, plan.hops)
        return Route(topology.level_name(plan.level), plan.routing_key, wait)
