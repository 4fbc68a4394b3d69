"""The AMQP entities the memory broker keeps: exchanges, queues, bindings, messages.

Built from the same :mod:`delayq.topology.declarations` the real provisioning applies, so
the memory topology cannot drift from the real one. Only what delayq relies on
is modelled, with RabbitMQ's semantics (see :mod:`delayq.testing.broker`).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from delayq.consume.delivery import H_DEAD_LETTER_REASON, H_ERROR_MESSAGE, H_ERROR_TYPE, Delivery
from delayq.message.envelope import H_ATTEMPT
from delayq.topology.declarations import ArgumentValue, BindingDecl

__all__ = ["Exchange", "Queue", "StoredMessage", "delivery_of"]


@dataclass
class StoredMessage:
    """One message as the broker holds it (a copy per queue it was routed to)."""

    body: bytes
    exchange: str
    routing_key: str
    content_type: str | None
    message_id: str | None
    timestamp_s: int | None
    headers: dict[str, Any]
    seq: int
    """Global publish order: breaks ties between messages due at the same instant."""
    enqueued_at_ms: int = 0
    expiration_ms: int | None = None
    """Per-message TTL (the ``expiration`` property); delayq itself never sets it."""
    deliveries: int = 0
    """How many times a consumer received it (a requeue counts)."""

    @property
    def redelivered(self) -> bool:
        return self.deliveries > 0

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")

    def json(self) -> Any:
        """The body decoded as JSON."""
        return json.loads(self.body)

    @property
    def attempt(self) -> int | None:
        """delayq's attempt header (``None`` when absent)."""
        value = self.headers.get(H_ATTEMPT)
        return value if isinstance(value, int) else None

    @property
    def reason(self) -> str | None:
        """Why delayq dead-lettered it (``exhausted``, ``non-retryable``, ...), if it did."""
        value = self.headers.get(H_DEAD_LETTER_REASON)
        return value if isinstance(value, str) else None

    @property
    def error_type(self) -> str | None:
        value = self.headers.get(H_ERROR_TYPE)
        return value if isinstance(value, str) else None

    @property
    def error_message(self) -> str | None:
        value = self.headers.get(H_ERROR_MESSAGE)
        return value if isinstance(value, str) else None

    def copy_for(self, seq: int, at_ms: int) -> StoredMessage:
        """An independent copy (each queue owns its own, as in RabbitMQ)."""
        return StoredMessage(
            body=self.body,
            exchange=self.exchange,
            routing_key=self.routing_key,
            content_type=self.content_type,
            message_id=self.message_id,
            timestamp_s=self.timestamp_s,
            headers=_deep_copy(self.headers),
            seq=seq,
            enqueued_at_ms=at_ms,
            expiration_ms=self.expiration_ms,
        )


def _deep_copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value


@dataclass
class Exchange:
    name: str
    type: str
    arguments: Mapping[str, ArgumentValue] = field(default_factory=dict)
    bindings: list[BindingDecl] = field(default_factory=list)

    @property
    def alternate(self) -> str | None:
        value = self.arguments.get("alternate-exchange")
        return value if isinstance(value, str) else None


@dataclass
class Queue:
    name: str
    arguments: Mapping[str, ArgumentValue] = field(default_factory=dict)
    role: str = ""
    messages: deque[StoredMessage] = field(default_factory=deque)

    def _int(self, key: str) -> int | None:
        value = self.arguments.get(key)
        return value if isinstance(value, int) else None

    @property
    def ttl_ms(self) -> int | None:
        """``x-message-ttl``: the same for every message, checked at the head only."""
        return self._int("x-message-ttl")

    @property
    def dead_letter_exchange(self) -> str | None:
        value = self.arguments.get("x-dead-letter-exchange")
        return value if isinstance(value, str) else None

    @property
    def dead_letter_routing_key(self) -> str | None:
        value = self.arguments.get("x-dead-letter-routing-key")
        return value if isinstance(value, str) else None

    @property
    def max_length(self) -> int | None:
        return self._int("x-max-length")

    @property
    def overflow(self) -> str:
        value = self.arguments.get("x-overflow")
        return value if isinstance(value, str) else "drop-head"

    @property
    def delivery_limit(self) -> int | None:
        """``x-delivery-limit`` (quorum queues): deliveries before dead-lettering."""
        if self.arguments.get("x-queue-type") != "quorum":
            return None
        return self._int("x-delivery-limit")

    def head_due_ms(self) -> int | None:
        """When the head expires (``None``: no TTL or empty). Only the head: RabbitMQ
        expires messages as they reach the head, never from the middle, so a short
        per-message TTL behind a long one waits for it."""
        if not self.messages:
            return None
        head = self.messages[0]
        ttls = [t for t in (self.ttl_ms, head.expiration_ms) if t is not None]
        return head.enqueued_at_ms + min(ttls) if ttls else None


def delivery_of(queue: str, message: StoredMessage) -> Delivery:
    """``message`` as a consumer of ``queue`` receives it."""
    return Delivery(
        queue=queue,
        body=message.body,
        routing_key=message.routing_key,
        message_id=message.message_id,
        content_type=message.content_type,
        headers=message.headers,
        redelivered=message.redelivered,
    )
