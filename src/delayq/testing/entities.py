"""The declared world of a memory broker: exchanges, queues and bindings, and how a
message moves through them (RabbitMQ's semantics, see :mod:`delayq.testing.broker`).

Routing (direct, fanout and topic exchanges, the default exchange, exchange-to-exchange
bindings, alternate exchanges), enqueueing under ``x-max-length`` (``reject-publish``
or ``drop-head``), and dead-lettering with RabbitMQ's ``x-death`` bookkeeping. No
clock of its own and no consumers: the broker moves time and delivers.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from delayq.errors import InvalidInput, TopologyConflict, TopologyMissing
from delayq.testing.clock import VirtualClock
from delayq.testing.model import Exchange, Queue, StoredMessage
from delayq.topology.declarations import BindingDecl, Declaration, ExchangeDecl, QueueDecl
from delayq.topology.headers import table_matches
from delayq.topology.report import ApplyResult, ApplyStatus
from delayq.topology.topic import topic_matches

__all__ = ["Dropped", "Entities", "Route"]

EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")


@dataclass(frozen=True)
class Dropped:
    """A message the broker discarded: dead-lettered into nothing, or pushed off a full queue."""

    message: StoredMessage
    queue: str
    reason: str
    at_ms: int


@dataclass
class Route:
    """The queues a message routes to, and those that refused it (full)."""

    queues: list[Queue] = field(default_factory=list)
    rejected: list[Queue] = field(default_factory=list)


class Entities:
    """A broker's exchanges and queues, by name, and what happens to a message in them."""

    def __init__(self, name: str, clock: VirtualClock) -> None:
        self.name = name
        self._clock = clock
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, Queue] = {}
        self.seq = itertools.count(1)
        """Publish order, kept on each stored copy (ties in due order go by it)."""
        self.dropped: list[Dropped] = []
        """Messages discarded (see :class:`Dropped`)."""

    def check(self, decl: Declaration) -> ApplyResult | None:
        """An existing exchange or queue compared with ``decl``; ``None`` when missing."""
        if isinstance(decl, ExchangeDecl) and decl.name in self.exchanges:
            return self.declare(decl)
        if isinstance(decl, QueueDecl) and decl.name in self.queues:
            return self.declare(decl)
        return None

    def declare(self, decl: Declaration) -> ApplyResult:
        """Declare one exchange, queue or binding (idempotent, like RabbitMQ)."""
        if isinstance(decl, ExchangeDecl):
            if decl.type not in EXCHANGE_TYPES:
                raise InvalidInput(f"the memory broker has no {decl.type!r} exchanges")
            current = self.exchanges.get(decl.name)
            if current is None:
                self.exchanges[decl.name] = Exchange(decl.name, decl.type, dict(decl.arguments))
                return ApplyResult(decl, ApplyStatus.CREATED)
            conflict = _conflict(
                "exchange",
                decl.name,
                {"type": current.type, **current.arguments},
                {"type": decl.type, **decl.arguments},
            )
            return _checked(decl, conflict)
        if isinstance(decl, QueueDecl):
            existing = self.queues.get(decl.name)
            if existing is None:
                self.queues[decl.name] = Queue(decl.name, dict(decl.arguments), decl.role)
                return ApplyResult(decl, ApplyStatus.CREATED)
            return _checked(decl, _conflict("queue", decl.name, existing.arguments, decl.arguments))
        self.bind(decl)
        return ApplyResult(decl, ApplyStatus.BOUND)

    def bind(self, binding: BindingDecl) -> None:
        source = self.exchange(binding.source)
        if binding.destination_type == "exchange":
            self.exchange(binding.destination)
        else:
            self.queue(binding.destination)
        if binding not in source.bindings:
            source.bindings.append(binding)

    def delete_queue(self, name: str) -> None:
        """Delete a queue and the bindings to it (its messages are gone)."""
        self.queue(name)
        del self.queues[name]
        for exchange in self.exchanges.values():
            exchange.bindings = [
                b
                for b in exchange.bindings
                if not (b.destination_type == "queue" and b.destination == name)
            ]

    def exchange(self, name: str) -> Exchange:
        try:
            return self.exchanges[name]
        except KeyError:
            raise TopologyMissing(
                f"exchange {name!r} does not exist: the delayq topology is not applied on "
                "this memory broker. Call broker.apply(topology) (or apply_topology()) first."
            ) from None

    def queue(self, name: str) -> Queue:
        try:
            return self.queues[name]
        except KeyError:
            raise TopologyMissing(
                f"queue {name!r} does not exist on memory broker {self.name!r}"
            ) from None

    def route(
        self, exchange: str, routing_key: str, headers: Mapping[str, Any] | None = None
    ) -> Route:
        if exchange == "":  # the default exchange: straight to the queue of that name
            queue = self.queues.get(routing_key)
            return Route([queue] if queue is not None else [])
        found: dict[str, Queue] = {}
        self._route_into(self.exchange(exchange), routing_key, headers or {}, found, set())
        return Route(list(found.values()))

    def _route_into(
        self,
        exchange: Exchange,
        key: str,
        headers: Mapping[str, Any],
        found: dict[str, Queue],
        seen: set[str],
    ) -> None:
        if exchange.name in seen:
            return
        seen.add(exchange.name)
        matched = [b for b in exchange.bindings if _matches(exchange.type, b, key, headers)]
        if not matched:
            # Only what this exchange's own bindings miss goes to its alternate.
            alternate = self.exchanges.get(exchange.alternate or "")
            if alternate is not None:
                self._route_into(alternate, key, headers, found, seen)
            return
        for binding in matched:
            if binding.destination_type == "exchange":
                target = self.exchanges.get(binding.destination)
                if target is not None:
                    self._route_into(target, key, headers, found, seen)
            else:
                queue = self.queues.get(binding.destination)
                if queue is not None:
                    found.setdefault(queue.name, queue)

    def enqueue(self, message: StoredMessage, route: Route) -> None:
        now = self._clock.now_ms()
        taken: list[Queue] = []
        for queue in route.queues:
            limit = queue.max_length
            if limit is not None and len(queue.messages) >= limit:
                if queue.overflow in ("reject-publish", "reject-publish-dlx"):
                    route.rejected.append(queue)
                    continue
                head = queue.messages.popleft()  # drop-head: the oldest goes
                self.dead_letter(queue, head, "maxlen")
            queue.messages.append(message.copy_for(next(self.seq), now))
            taken.append(queue)
        route.queues = taken

    def dead_letter(self, queue: Queue, message: StoredMessage, reason: str) -> None:
        exchange = queue.dead_letter_exchange
        now = self._clock.now_ms()
        if exchange is None:
            self.dropped.append(Dropped(message, queue.name, reason, now))
            return
        key = queue.dead_letter_routing_key or message.routing_key
        headers = _with_death(message, queue.name, reason, now)
        if message.expiration_ms is not None:  # RabbitMQ moves it into the x-death entry
            headers["x-death"][0]["original-expiration"] = str(message.expiration_ms)
        dead = StoredMessage(
            body=message.body,
            exchange=exchange,
            routing_key=key,
            content_type=message.content_type,
            message_id=message.message_id,
            timestamp_s=message.timestamp_s,
            headers=headers,
            seq=0,
        )
        if exchange and exchange not in self.exchanges:
            self.dropped.append(Dropped(dead, queue.name, f"{reason}: no exchange {exchange}", now))
            return
        route = self.route(exchange, key, headers)
        self.enqueue(dead, route)
        if not route.queues:
            self.dropped.append(Dropped(dead, queue.name, f"{reason}: unroutable", now))


def _matches(
    exchange_type: str, binding: BindingDecl, routing_key: str, headers: Mapping[str, Any]
) -> bool:
    if exchange_type == "fanout":
        return True
    if exchange_type == "topic":
        return topic_matches(binding.routing_key, routing_key)
    if exchange_type == "headers":
        return table_matches(binding.arguments, headers)
    return binding.routing_key == routing_key


def _with_death(message: StoredMessage, queue: str, reason: str, now: int) -> dict[str, Any]:
    """The headers after dead-lettering, with RabbitMQ's ``x-death`` bookkeeping: one
    entry per (queue, reason), newest first, its count going up on each repeat."""
    headers = dict(message.headers)
    deaths = [dict(d) for d in headers.get("x-death", []) if isinstance(d, Mapping)]
    entry = next((d for d in deaths if d.get("queue") == queue and d.get("reason") == reason), None)
    if entry is None:
        entry = {"queue": queue, "reason": reason, "count": 0}
    else:
        deaths.remove(entry)
    entry.update(
        count=int(entry.get("count", 0)) + 1,
        exchange=message.exchange,
        **{"routing-keys": [message.routing_key]},
        time=datetime.fromtimestamp(now // 1000, tz=timezone.utc),  # as pika decodes it
    )
    headers["x-death"] = [entry, *deaths]
    headers.setdefault("x-first-death-queue", queue)
    headers.setdefault("x-first-death-reason", reason)
    headers.setdefault("x-first-death-exchange", message.exchange)
    headers["x-last-death-queue"] = queue
    headers["x-last-death-reason"] = reason
    headers["x-last-death-exchange"] = message.exchange
    return headers


def _conflict(
    kind: str, name: str, current: Mapping[str, Any], wanted: Mapping[str, Any]
) -> TopologyConflict | None:
    for key in sorted(set(current) | set(wanted)):
        if current.get(key) != wanted.get(key):
            have, want = current.get(key), wanted.get(key)
            return TopologyConflict(
                kind,
                name,
                key,
                None if have is None else str(have),
                None if want is None else str(want),
            )
    return None


def _checked(decl: Declaration, conflict: TopologyConflict | None) -> ApplyResult:
    if conflict is None:
        return ApplyResult(decl, ApplyStatus.PRESENT)
    return ApplyResult(decl, ApplyStatus.CONFLICT, conflict)
