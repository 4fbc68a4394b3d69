"""The message factory: a caller's arguments validated and turned into the message on the
wire (exchange, routing key, body, properties) before any I/O, the same for both publishers."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from delayq.durations import to_ms
from delayq.errors import (
    BodyTooLarge,
    InvalidBody,
    InvalidInput,
    UnboundRoutingKey,
)
from delayq.message.envelope import (
    Message,
    OutgoingMessage,
    Receipt,
    encode_body,
    envelope_headers,
    epoch_ms,
    new_message_id,
    restamp,
)
from delayq.message.validate import validate_headers, validate_message_id, validate_routing_key
from delayq.topology.cascade import Strategy
from delayq.topology.model import Topology
from delayq.topology.route import Router
from delayq.topology.topic import BindingKeys

__all__ = [
    "MessageFactory",
    "unbound_key",
]


_new = object.__new__
_R = Receipt.__dict__
_set_r = tuple(_R[n].__set__ for n in Receipt.__slots__)
_O = OutgoingMessage.__dict__
_set_o = tuple(_O[n].__set__ for n in OutgoingMessage.__slots__)


def _receipt(*values: Any) -> Receipt:
    """``Receipt(*values)`` in its fields' order, its slots set straight: a frozen
    dataclass's own ``__init__`` goes through ``object.__setattr__`` field by field, at
    about three times the cost, and a web app's publish per request builds two."""
    made = _new(Receipt)
    for setter, value in zip(_set_r, values, strict=True):
        setter(made, value)
    return made


def _outgoing(*values: Any) -> OutgoingMessage:
    """``OutgoingMessage(*values)``, as :func:`_receipt` (every field given)."""
    made = _new(OutgoingMessage)
    for setter, value in zip(_set_o, values, strict=True):
        setter(made, value)
    return made


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
        # Headers-exchange publishers often send no routing key; routing ignores it there.
        self._keyless = topology.routes_by_headers

    def now_ms(self) -> int:
        """The time on this factory's clock (a memory broker's virtual time, say)."""
        return self._clock_ms()

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

    def restamp(self, built: Sequence[OutgoingMessage]) -> list[OutgoingMessage]:
        """``built`` stamped with this factory's clock now: for messages that waited
        (for room under a publisher's in-flight bound) between build and send."""
        now_ms = self._clock_ms()
        return [restamp(msg, now_ms) for msg in built]

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
        if not (self._keyless and routing_key == ""):
            routing_key = validate_routing_key(routing_key)
        message_id = self._new_id() if message_id is None else validate_message_id(message_id)
        exchange, wire_key, wait = self.router.to_destinations(
            delay_ms, routing_key, chosen, message_id
        )
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
        receipt = _receipt(
            message_id,
            routing_key,
            exchange,
            wait.label,
            delay_ms,
            wait.ms,
            now_ms,
            chosen,
            wait.hops,
        )
        return _outgoing(
            exchange,
            wire_key,
            data,
            content_type,
            message_id,
            now_ms // 1000,
            user_headers,
            receipt,
            {},
        )
