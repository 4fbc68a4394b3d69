"""The message on the wire, built by pure code shared by both publishers.

``MessageFactory.build`` validates everything a caller passes and decides
exchange, routing key, body bytes and properties before any I/O, so bad input
raises before anything is sent and both adapters send the same bytes.

Headers use the ``delayq-`` prefix (``x-`` belongs to the broker) and are
replaced on every hop, never stacked.
"""

from __future__ import annotations

import difflib
import json
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from pydantic import BaseModel

from delayq.durations import to_ms
from delayq.errors import (
    BodyTooLarge,
    HeadersTooLarge,
    InvalidBody,
    InvalidHeaders,
    InvalidInput,
    InvalidMessageId,
    InvalidRoutingKey,
    UnboundRoutingKey,
)
from delayq.message.limits import (
    DEFAULT_LIMITS,
    MAX_BODY_BYTES,
    MAX_HEADER_BYTES,
    MAX_HEADERS,
    MessageLimits,
)
from delayq.topology.cascade import Strategy
from delayq.topology.model import Topology
from delayq.topology.route import Router
from delayq.topology.topic import BindingKeys

__all__ = [
    "CONTENT_BYTES",
    "CONTENT_JSON",
    "CONTENT_TEXT",
    "DEFAULT_MAX_BODY_BYTES",
    "ENVELOPE_VERSION",
    "HEADER_PREFIX",
    "H_ATTEMPT",
    "H_DELAY_MS",
    "H_DUE_AT",
    "H_PUBLISHED_AT",
    "H_ROUTING_KEY",
    "H_TIER",
    "H_TIER_MS",
    "H_VERSION",
    "IMMEDIATE",
    "MAX_HEADERS",
    "MAX_HEADERS_BYTES",
    "Message",
    "MessageFactory",
    "OutgoingMessage",
    "Receipt",
    "encode_body",
    "envelope_headers",
    "epoch_ms",
    "headers_size",
    "new_message_id",
    "unbound_key",
    "validate_headers",
    "validate_routing_key",
]

ENVELOPE_VERSION = 1
HEADER_PREFIX = "delayq-"
H_VERSION = "delayq-version"
H_DELAY_MS = "delayq-delay-ms"
H_TIER = "delayq-tier"
H_TIER_MS = "delayq-tier-ms"
H_PUBLISHED_AT = "delayq-published-at"
H_DUE_AT = "delayq-due-at"
H_ATTEMPT = "delayq-attempt"
H_ROUTING_KEY = "delayq-routing-key"

IMMEDIATE = "immediate"
CONTENT_JSON = "application/json"
CONTENT_TEXT = "text/plain; charset=utf-8"
CONTENT_BYTES = "application/octet-stream"

DEFAULT_MAX_BODY_BYTES = MAX_BODY_BYTES
"""16 MiB (see :mod:`delayq.message.limits` for why); a topology's ``limits`` may change it."""
MAX_HEADERS_BYTES = MAX_HEADER_BYTES
_INT64 = (-(2**63), 2**63 - 1)


def epoch_ms() -> int:
    return time.time_ns() // 1_000_000


def new_message_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class Message:
    """One message of a ``publish_many`` batch; fields as for ``publish``."""

    body: object
    routing_key: str
    delay: object
    message_id: str | None = None
    headers: Mapping[str, Any] | None = None
    strategy: Strategy | str | None = None
    """``None``: the topology's default strategy."""


@dataclass(frozen=True, slots=True)
class Receipt:
    """What the broker confirmed: which message, where it waits, when it is due."""

    message_id: str
    routing_key: str
    exchange: str
    tier: str | None
    """The tier's label (``"exact"`` for the cascade), or ``None`` for an immediate message."""
    delay_ms: int
    tier_ms: int
    """How long the message actually waits (a tier's TTL, or the cascade's whole units)."""
    published_at_ms: int
    strategy: Strategy = Strategy.TIERED
    hops: int = 0
    """Queues the message waits in: 1 for a tier, ``popcount(units)`` for the cascade,
    0 when immediate."""

    @property
    def delay(self) -> timedelta:
        """The delay the caller asked for."""
        return timedelta(milliseconds=self.delay_ms)

    @property
    def lateness(self) -> timedelta:
        """How much later than asked the message is due: the tier minus the delay."""
        return timedelta(milliseconds=self.tier_ms - self.delay_ms)

    @property
    def published_at(self) -> datetime:
        return datetime.fromtimestamp(self.published_at_ms / 1000, tz=timezone.utc)

    @property
    def due_at(self) -> datetime:
        """When the wait runs out and the message is routed to its destination."""
        return datetime.fromtimestamp((self.published_at_ms + self.tier_ms) / 1000, tz=timezone.utc)


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """Everything an adapter needs to send one message; no I/O object inside."""

    exchange: str
    routing_key: str
    body: bytes
    content_type: str
    message_id: str
    timestamp_s: int
    headers: dict[str, Any]
    receipt: Receipt


def encode_body(body: object) -> tuple[bytes, str]:
    """Bytes and content type for a body: bytes, str, a pydantic model or a JSON value."""
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body), CONTENT_BYTES
    if isinstance(body, str):
        try:
            return body.encode("utf-8"), CONTENT_TEXT
        except UnicodeEncodeError as exc:
            raise InvalidBody(f"str body cannot be encoded as UTF-8 ({exc})") from exc
    try:
        value = body.model_dump(mode="json") if isinstance(body, BaseModel) else body
        text = json.dumps(value, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
        return text.encode("utf-8"), CONTENT_JSON
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidBody(
            f"body of type {type(body).__name__} cannot be encoded ({exc}); pass bytes, "
            "str, a pydantic model, or a JSON value (dict, list, int, float, bool, None) "
            "without NaN or infinity"
        ) from exc


def _utf8_len(value: str, error: type[InvalidInput], what: str) -> int:
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise error(f"{what} cannot be encoded as UTF-8 ({exc})") from None


def validate_routing_key(routing_key: object) -> str:
    """A routing key is a non-empty str of at most 255 bytes without wildcards."""
    if not isinstance(routing_key, str):
        raise InvalidRoutingKey(f"routing key must be a str, got {type(routing_key).__name__}")
    if not routing_key:
        raise InvalidRoutingKey("routing key must not be empty")
    if _utf8_len(routing_key, InvalidRoutingKey, "routing key") > 255:
        raise InvalidRoutingKey("routing key is longer than AMQP's 255 bytes")
    if "*" in routing_key or "#" in routing_key:
        raise InvalidRoutingKey(
            f"routing key {routing_key!r} contains a wildcard ('*' or '#'); wildcards belong "
            "in binding keys, a message is published with a concrete key"
        )
    return routing_key


def _check_value(key: str, value: object, depth: int = 0) -> int:
    """Validate one header value; return the most bytes AMQP needs for it, type tag included.

    Field-table encoding: str and bytes are a 4-byte length and the data, ints at
    most 8 bytes (pika and pamqp pick the smallest width), a bool 1, None 0, an
    array a 4-byte length and its tagged values, a table a 4-byte length and its
    entries (a 1-byte name length, the name, the tagged value).
    """
    if depth > 8:
        raise InvalidHeaders(f"header {key!r} is nested more than 8 levels deep")
    if value is None:
        return 1
    if isinstance(value, bool):
        return 2
    if isinstance(value, int):
        if not _INT64[0] <= value <= _INT64[1]:
            raise InvalidHeaders(f"header {key!r}: int {value} does not fit in 64 bits")
        return 9
    if isinstance(value, str):
        return 5 + _utf8_len(value, InvalidHeaders, f"header {key!r}")
    if isinstance(value, bytes):
        return 5 + len(value)
    if isinstance(value, float):
        raise InvalidHeaders(
            f"header {key!r} is a float ({value!r}); pika cannot encode floats in headers: "
            "send an int (with the unit in the name, like 'price-cents') or a str"
        )
    if isinstance(value, (list, tuple)):
        return 5 + sum(_check_value(key, v, depth + 1) for v in value)
    if isinstance(value, Mapping):
        return 1 + _table_size(key, value, depth + 1)
    raise InvalidHeaders(
        f"header {key!r} has a value of type {type(value).__name__}; allowed: str, int, "
        "bool, bytes, None, and lists or dicts of those"
    )


def _table_size(where: str, table: Mapping[Any, Any], depth: int) -> int:
    """Validate a field table's names and values; return its encoded size (at most)."""
    size = 4
    for name, value in table.items():
        if not isinstance(name, str) or not name:
            raise InvalidHeaders(
                f"header {where!r} has a name that is not a non-empty str: {name!r}"
            )
        length = _utf8_len(name, InvalidHeaders, "header name")
        if length > 255:
            raise InvalidHeaders(f"header name {name[:40]!r}... is longer than 255 bytes")
        size += 1 + length + _check_value(name if depth == 0 else where, value, depth)
    return size


def headers_size(headers: Mapping[str, Any]) -> int:
    """The most bytes AMQP needs to encode ``headers`` as a field table (validating them)."""
    return _table_size("(headers)", headers, 0)


def validate_headers(headers: object, limits: MessageLimits = DEFAULT_LIMITS) -> dict[str, Any]:
    """User headers: str keys without the reserved ``delayq-``/``x-`` prefixes, AMQP values,
    within ``limits`` (:class:`~delayq.errors.HeadersTooLarge` otherwise)."""
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise InvalidHeaders(f"headers must be a mapping, got {type(headers).__name__}")
    if len(headers) > limits.max_headers:
        raise HeadersTooLarge(
            f"{len(headers)} headers; at most {limits.max_headers} are allowed "
            "(limits.max_headers; put large data in the body)"
        )
    for key in headers:
        if not isinstance(key, str) or not key:
            raise InvalidHeaders(f"header names must be non-empty str, got {key!r}")
        lowered = key.lower()
        if lowered.startswith(HEADER_PREFIX) or lowered.startswith("x-"):
            raise InvalidHeaders(
                f"header {key!r} uses a reserved prefix: 'delayq-' belongs to delayq and "
                "'x-' to RabbitMQ"
            )
    size = headers_size(headers)
    if size > limits.max_header_bytes:
        raise HeadersTooLarge(
            f"headers take {size} bytes encoded; at most {limits.max_header_bytes} are "
            "allowed (limits.max_header_bytes: the headers and delayq's own must fit in one "
            "AMQP frame; put large data in the body)"
        )
    return {key: _plain(value) for key, value in headers.items()}


def _plain(value: Any) -> Any:
    """Tuples as lists and mappings as dicts: the only containers pika and pamqp encode."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def validate_message_id(message_id: object) -> str:
    if not isinstance(message_id, str):
        raise InvalidMessageId(f"message id must be a str, got {type(message_id).__name__}")
    if not message_id or _utf8_len(message_id, InvalidMessageId, "message id") > 255:
        raise InvalidMessageId("message id must be 1 to 255 bytes long")
    return message_id


def envelope_headers(
    delay_ms: int,
    tier_label: str | None,
    tier_ms: int,
    now_ms: int,
    attempt: int,
    routing_key: str,
) -> dict[str, Any]:
    """The ``delayq-*`` headers of one hop (all ints or str: pika cannot send floats)."""
    return {
        H_VERSION: ENVELOPE_VERSION,
        H_DELAY_MS: delay_ms,
        H_TIER: tier_label or IMMEDIATE,
        H_TIER_MS: tier_ms,
        H_PUBLISHED_AT: now_ms,
        H_DUE_AT: now_ms + tier_ms,
        H_ATTEMPT: attempt,
        H_ROUTING_KEY: routing_key,
    }


def _near_keys(routing_key: str, keys: Sequence[str]) -> list[str]:
    """Up to 3 keys the binding keys take that look like ``routing_key`` (a typo)."""
    words = routing_key.split(".")
    scored = []
    for key in keys:
        taken: list[str] = []  # the binding key with its wildcards filled from the typo
        for i, word in enumerate(key.split(".")):
            if word == "#":
                taken.extend(words[i:])
                break
            taken.append(words[i] if word == "*" and i < len(words) else word)
        example = ".".join(taken)
        ratio = difflib.SequenceMatcher(None, routing_key, example).ratio()
        if ratio >= 0.75:
            shown = repr(example) if example == key else f"{example!r} (bound by {key!r})"
            scored.append((-ratio, shown))
    return [shown for _ratio, shown in sorted(scored)[:3]]


def unbound_key(topology: Topology, routing_key: str, keys: Sequence[str]) -> UnboundRoutingKey:
    """The error for a routing key that none of ``keys`` (the topology's) matches."""
    if not keys:
        known, fix = (
            ", which lists no destinations and no external_bindings",
            "List the destinations in the topology",
        )
    else:
        close = _near_keys(routing_key, keys)
        shown = ", ".join(repr(k) for k in keys[:8]) + (", ..." if len(keys) > 8 else "")
        guess = f"; did you mean {' or '.join(close)}?" if close else ""
        known, fix = f" (bindings: {shown}{guess})", "Fix the key"
    return UnboundRoutingKey(
        f"routing key {routing_key!r} matches no binding of namespace "
        f"{topology.namespace!r}{known}: nothing was sent, as the message could only be "
        f"parked in {topology.unrouted} when due. {fix}, or, for a queue bound outside the "
        'topology file, add its binding key to `external_bindings` (["#"] accepts every key).'
    )


class MessageFactory:
    """Turns a publish call into an :class:`OutgoingMessage`, or raises before any I/O."""

    def __init__(
        self,
        topology: Topology,
        *,
        max_body_bytes: int | None = None,
        clock_ms: Callable[[], int] = epoch_ms,
        new_id: Callable[[], str] = new_message_id,
    ) -> None:
        """``max_body_bytes`` overrides the topology's ``limits.max_body_bytes``."""
        self.topology = topology
        self.limits = topology.limits
        if max_body_bytes is not None:
            self.limits = self.limits.replace(max_body_bytes=max_body_bytes)
        self.max_body_bytes = self.limits.max_body_bytes
        self._clock_ms = clock_ms
        self._new_id = new_id
        self.router = Router(topology)
        self._strategy = topology.strategy
        self._bound = BindingKeys(topology.binding_keys)

    def build_many(self, messages: Iterable[Message]) -> list[OutgoingMessage]:
        """Validate a whole batch first, so bad input anywhere sends nothing."""
        built = []
        for index, msg in enumerate(messages):
            if not isinstance(msg, Message):
                raise InvalidBody(
                    f"publish_many takes delayq.Message items; item {index} is {type(msg).__name__}"
                )
            try:
                built.append(
                    self.build(
                        msg.body,
                        msg.routing_key,
                        msg.delay,
                        message_id=msg.message_id,
                        headers=msg.headers,
                        strategy=msg.strategy,
                    )
                )
            except InvalidInput as exc:
                raise type(exc)(f"message {index}: {exc}") from exc
        return built

    def build(
        self,
        body: object,
        routing_key: str,
        delay: object,
        *,
        message_id: str | None = None,
        headers: Mapping[str, Any] | None = None,
        attempt: int = 1,
        strategy: Strategy | str | None = None,
    ) -> OutgoingMessage:
        """Validate and build one message (delay: ``timedelta`` or ``"15m"``-style str;
        ``strategy``: ``"tiered"``, ``"exact"``, or ``None`` for the topology's default)."""
        delay_ms = to_ms(delay)
        chosen = self._strategy if strategy is None else self.router.strategy(strategy)
        routing_key = validate_routing_key(routing_key)
        exchange, wire_key, wait = self.router.to_destinations(delay_ms, routing_key, chosen)
        message_id = self._new_id() if message_id is None else validate_message_id(message_id)
        user_headers = validate_headers(headers, self.limits)
        data, content_type = encode_body(body)
        if len(data) > self.max_body_bytes:
            raise BodyTooLarge(
                f"body is {len(data)} bytes, more than the limit of {self.max_body_bytes} "
                "(limits.max_body_bytes; put large data in a blob store and send its address)"
            )
        if self._bound.match(routing_key) is None:  # every strategy, delay 0 too
            raise unbound_key(self.topology, routing_key, self._bound.keys)
        now_ms = self._clock_ms()
        user_headers.update(
            envelope_headers(delay_ms, wait.label, wait.ms, now_ms, attempt, routing_key)
        )
        receipt = Receipt(
            message_id=message_id,
            routing_key=routing_key,
            exchange=exchange,
            tier=wait.label,
            delay_ms=delay_ms,
            tier_ms=wait.ms,
            published_at_ms=now_ms,
            strategy=chosen,
            hops=wait.hops,
        )
        return OutgoingMessage(
            exchange=exchange,
            routing_key=wire_key,
            body=data,
            content_type=content_type,
            message_id=message_id,
            timestamp_s=now_ms // 1000,
            headers=user_headers,
            receipt=receipt,
        )
