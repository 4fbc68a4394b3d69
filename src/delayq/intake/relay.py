"""What the bridge does with one message of an intake queue: pure, no I/O.

A message a plugin-style publisher sent (:class:`Incoming`: its routing key, body and
AMQP properties) becomes either a :class:`Forward`, the message scheduled into the
tier its ``x-delay`` asks for (or the exact cascade), or a :class:`Park`, the message
as it came, bound for the intake's DLQ with the reason. The bridge sends either with
a publisher confirm and only then acks the original (:mod:`delayq.sync.bridge`).

What a forwarded message keeps: its routing key (a fanout intake's empty key becomes
:data:`FANOUT_KEY`; a direct or topic intake parks it), body, headers (``x-delay`` set to
minus the delay, as the plugin left it, so consumers can tell it was delayed), message
id, and its properties (content type and encoding, correlation id, reply-to, type, app
id, priority, timestamp). Not ``expiration``: a per-message TTL would cut the tier's
wait short and dead-letter the message early; nor ``user_id``, which the broker checks
against the bridge's own user. delayq's envelope headers are added, as on any delayq
message. A message without an id gets one derived from its content (exchange, routing
key, the publisher's headers and properties, body: :func:`intake_id`), so the copy a bridge
sends again after a crash, or a replay of a parked one, is a duplicate an idempotent
consumer skips; two messages identical in all of these are then one message to such a
consumer (give each its own ``message_id`` if that matters).

:meth:`Relay.plan` never raises: whatever a message holds, the bridge gets a plan, and one
message never stops it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from delayq.consume.delivery import (
    H_DEAD_LETTER_REASON,
    H_ERROR_MESSAGE,
    H_ERROR_TYPE,
    H_FAILED_AT,
    H_QUEUE,
)
from delayq.durations import format_ms
from delayq.errors import InvalidInput
from delayq.intake.delay import DELAY_HEADERS, X_DELAY, BadDelay, read_delay
from delayq.message.envelope import (
    H_ROUTING_KEY,
    HEADER_PREFIX,
    OutgoingMessage,
    Receipt,
    epoch_ms,
)
from delayq.message.factory import MessageFactory
from delayq.message.validate import validate_message_id
from delayq.topology.intakes import Intake
from delayq.topology.model import Topology

__all__ = [
    "BAD_DELAY",
    "BRIDGE_ERROR",
    "BROKER_HEADERS",
    "FANOUT_KEY",
    "IDENTIFYING",
    "UNSCHEDULABLE",
    "Forward",
    "Incoming",
    "Park",
    "Relay",
    "intake_id",
]

BAD_DELAY = "bad-x-delay"
"""The DLQ reason of a message whose ``x-delay`` cannot be read as a delay."""

UNSCHEDULABLE = "unschedulable"
"""The DLQ reason of a message delayq cannot schedule: a delay past the ladder, a routing
key no destination binds, a body past the size limit, an invalid routing key."""

BRIDGE_ERROR = "bridge-error"
"""The DLQ reason of a message the bridge failed on for a reason of its own (a bug):
parked as it came, with the error, so that no message can stop the bridge."""

BROKER_HEADERS = frozenset({"x-delivery-count", "x-acquired-count", "x-death", "x-received-from"})
"""Headers a broker adds as a message moves (with every ``x-first-death-*`` and
``x-last-death-*``; ``x-acquired-count`` since RabbitMQ 4.3): not part of what the
publisher sent, so not of its derived id."""

_MAX_DELAY_MS = timedelta.max // timedelta(milliseconds=1)
"""The longest delay a ``timedelta`` holds (about 2.7 million years): beyond it, no
ladder reaches either (Java's ``Long.MAX_VALUE`` ms is 8.64e16 past it)."""

FANOUT_KEY = "fanout"
"""The routing key a ``fanout`` intake schedules a message under when it was published
with the empty key, as fanout publishers do. delayq routes, retries and replays by key,
and cannot by the empty one (a retry's key would fall back to its queue's name); every
destination of a fanout intake binds ``#``, which matches this key, so the message still
reaches each of them. A non-empty key is kept as it came."""

CARRIED = ("content_encoding", "correlation_id", "reply_to", "type", "app_id", "priority")
"""The AMQP properties a forwarded message keeps besides its headers, id, content type
and timestamp (pika's names)."""


@dataclass(frozen=True)
class Incoming:
    """One message of an intake queue, as the broker delivered it."""

    routing_key: str
    body: bytes
    properties: Mapping[str, Any] = field(default_factory=dict)
    """pika's names: ``headers``, ``content_type``, ``message_id``, ``timestamp``..."""

    @property
    def headers(self) -> Mapping[str, Any]:
        return self.properties.get("headers") or {}


@dataclass(frozen=True)
class Forward:
    """Schedule ``message`` (its tier or cascade), then ack the original."""

    message: OutgoingMessage


@dataclass(frozen=True)
class Park:
    """Send ``message`` (the original, with the reason) to the intake's DLQ, then ack."""

    message: OutgoingMessage
    reason: str


class Relay:
    """Plans each message of one intake of ``topology``."""

    def __init__(
        self,
        topology: Topology,
        intake: Intake,
        *,
        clock_ms: Callable[[], int] = epoch_ms,
    ) -> None:
        self.topology = topology
        self.intake = intake
        self.queue = intake.queue_name(topology.namespace)
        self.dlq = intake.dlq_name(topology.namespace)
        self._factory = MessageFactory(topology, clock_ms=clock_ms)
        self._clock_ms = clock_ms

    def plan(self, incoming: Incoming) -> Forward | Park:
        """A forward into the message's tier, or a park with the reason; never raises."""
        try:
            return self._plan(incoming)
        except Exception as exc:  # a bug of delayq's: the message is kept, the bridge goes on
            return self.failed(incoming, exc)

    def failed(self, incoming: Incoming, exc: BaseException) -> Park:
        """``incoming`` parked as :data:`BRIDGE_ERROR`: the bridge failed on it with
        ``exc`` (planning it, or sending its forward:
        :class:`~delayq.errors.UnsendableMessage`, which names the cause)."""
        said = f"the bridge failed on this message: {type(exc).__name__}: {exc}"
        return self._park(incoming, BRIDGE_ERROR, type(exc).__name__, said)

    def _plan(self, incoming: Incoming) -> Forward | Park:
        routing_key = self.routing_key(incoming.routing_key)
        delay_ms = read_delay(incoming.headers, now_ms=self._clock_ms())
        if isinstance(delay_ms, BadDelay):
            return self._park(incoming, BAD_DELAY, "InvalidDelay", delay_ms.reason)
        if not routing_key and not self.topology.routes_by_headers:  # headers: no key needed
            return self._park(
                incoming,
                UNSCHEDULABLE,
                "InvalidRoutingKey",
                f"routing key is empty: a {self.intake.type} intake routes by the key, and "
                "delayq schedules nothing under the empty key (no destination can bind it; "
                "a topic exchange would match it by '#' alone). Publish with a key, or "
                "declare the intake type: fanout if every destination is meant",
            )
        if delay_ms > _MAX_DELAY_MS:
            return self._park(
                incoming,
                UNSCHEDULABLE,
                "InvalidDelay",
                f"{_asked(incoming.headers)} is longer than any delay delayq schedules (the "
                f"ladder's longest tier is {format_ms(self.topology.ladder.max_ms)})",
            )
        message_id = self._message_id(incoming)
        try:
            built = self._factory.build(
                incoming.body,
                routing_key,
                timedelta(milliseconds=delay_ms),
                message_id=message_id,
                strategy=self.intake.strategy,
            )
        except InvalidInput as exc:
            return self._park(incoming, UNSCHEDULABLE, type(exc).__name__, str(exc))
        # Not the broker's own history of the message (delivery counts, dead-letter
        # deaths: a publisher's x-death naming a queue on its way makes RabbitMQ 3.x drop
        # it there as a dead-letter cycle, and stall the tier behind it).
        headers = _as_published(incoming.headers)
        for annotation in DELAY_HEADERS[1:]:  # honoured here: a broker must not delay it again
            headers.pop(annotation, None)
        if X_DELAY in headers:
            headers[X_DELAY] = -delay_ms  # as the plugin left it: delayed, not to be again
        headers.update(built.headers)
        return Forward(
            OutgoingMessage(  # ``built`` with their headers and properties
                built.exchange,
                built.routing_key,
                built.body,
                built.content_type,
                built.message_id,
                built.timestamp_s,
                headers,
                built.receipt,
                _carried(incoming.properties),
            )
        )

    def routing_key(self, published: str) -> str:
        """The key a message published under ``published`` is scheduled (and parked)
        under: its own, but :data:`FANOUT_KEY` for the empty key on a fanout intake."""
        if published or self.intake.type != "fanout":
            return published
        return FANOUT_KEY

    def _message_id(self, incoming: Incoming) -> str:
        given = incoming.properties.get("message_id")
        if given:
            try:
                return validate_message_id(given)
            except InvalidInput:
                pass
        props = incoming.properties
        try:
            headers = incoming.headers
            return intake_id(
                self.intake.exchange, incoming.routing_key, headers, props, incoming.body
            )
        except Exception:  # headers it cannot read (nested too deep...): still one stable id
            return intake_id(self.intake.exchange, incoming.routing_key, {}, props, incoming.body)

    def park(self, incoming: Incoming, said: str) -> Park:
        """``incoming`` parked as :data:`BRIDGE_ERROR`: its forward cannot be sent."""
        return self._park(incoming, BRIDGE_ERROR, "UnsendableMessage", said)

    def _park(self, incoming: Incoming, reason: str, error: str, said: str) -> Park:
        now = self._clock_ms()
        headers = _their_headers(incoming.headers)
        headers.update(
            {
                H_DEAD_LETTER_REASON: reason,
                H_ERROR_TYPE: f"delayq.errors.{error}",
                H_ERROR_MESSAGE: said[:1024],
                H_FAILED_AT: now,
                H_QUEUE: self.queue,
                H_ROUTING_KEY: self.routing_key(incoming.routing_key),  # a replay's key
            }
        )
        message_id = str(incoming.properties.get("message_id") or self._message_id(incoming))
        exchange = self.topology.direct_exchange
        message = OutgoingMessage(
            exchange=exchange,
            routing_key=self.dlq,
            body=incoming.body,
            content_type=incoming.properties.get("content_type") or "application/octet-stream",
            message_id=message_id,
            timestamp_s=int(incoming.properties.get("timestamp") or now // 1000),
            headers=headers,
            receipt=Receipt(message_id, self.dlq, exchange, None, 0, 0, now),
            properties=_carried(incoming.properties),
        )
        return Park(message, f"{reason}: {said}")


IDENTIFYING = (
    "content_type",
    "content_encoding",
    "correlation_id",
    "reply_to",
    "type",
    "app_id",
    "user_id",
    "priority",
    "timestamp",
)
"""The AMQP properties (pika's names) a derived id reads: what the publisher set and no
broker changes. Not ``expiration``, which RabbitMQ drops when it dead-letters a message,
nor ``delivery_mode``, which a client may set for every message alike."""


def intake_id(
    exchange: str,
    routing_key: str,
    headers: Mapping[str, Any],
    properties: Mapping[str, Any],
    body: bytes,
) -> str:
    """The id the bridge gives a message published without one: a digest of what its
    publisher sent (``properties``: :data:`IDENTIFYING`), so that the same message has
    the same id whenever it is read (a redelivery after a crash, a replay from the DLQ),
    and two requests that differ only in a correlation id are two messages. Headers the
    broker added (:data:`BROKER_HEADERS`) and delayq's own are left out."""
    theirs = _as_published(headers)
    digest = hashlib.sha256()
    for part in (
        exchange,
        routing_key,
        json.dumps(_plain(theirs), sort_keys=True, default=repr),
        *(str(properties.get(name)) for name in IDENTIFYING),
    ):
        digest.update(part.encode("utf-8", "surrogatepass") + b"\0")
    digest.update(body)
    return f"intake-{digest.hexdigest()[:32]}"


def _shown(value: Any) -> str:
    text = value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"


def _asked(headers: Mapping[str, Any]) -> str:
    """The delay header a message came with, for a reason: ``x-delay 99999... ms``."""
    for name in DELAY_HEADERS:
        if name in headers:
            unit = "" if name == DELAY_HEADERS[2] else " ms"
            return f"{name} {_shown(headers[name])}{unit}"
    return "its delay"


def _added_by_broker(key: object) -> bool:
    if not isinstance(key, str):
        return False
    key = key.lower()
    return key in BROKER_HEADERS or key.startswith(("x-first-death-", "x-last-death-"))


def _as_published(headers: Mapping[str, Any]) -> dict[str, Any]:
    """The headers its publisher sent: :func:`_their_headers` without those a broker
    added as the message moved (:data:`BROKER_HEADERS`)."""
    return {k: v for k, v in _their_headers(headers).items() if not _added_by_broker(k)}


def _their_headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    """The publisher's headers, without any of delayq's (an envelope is written anew)."""
    return {
        k: v
        for k, v in headers.items()
        if not (isinstance(k, str) and k.lower().startswith(HEADER_PREFIX))
    }


def _carried(properties: Mapping[str, Any]) -> dict[str, Any]:
    get = properties.get
    return {name: value for name in _CARRIED_ALL if (value := get(name)) is not None}


_CARRIED_ALL = (*CARRIED, "content_type", "timestamp")


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).hex()
    return value
