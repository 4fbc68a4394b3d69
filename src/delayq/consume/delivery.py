"""What to do with a delivery: the pure decisions both consumers only perform.

A delivery ends in exactly one of: done (ack), duplicate (ack, counted), retry
later (publish to the retry tier for the policy's next delay, addressed to the
failing queue alone, then ack), or dead-lettered (publish to ``<queue>.dlq``
with the reason, then ack). The republish is confirmed before the ack, so a
crash between the two can only duplicate, which the idempotency store absorbs.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ValidationError

from delayq.durations import to_ms
from delayq.errors import DelayqError
from delayq.message.envelope import (
    CONTENT_BYTES,
    CONTENT_JSON,
    H_ATTEMPT,
    H_GENERATION,
    H_ROUTING_KEY,
    OutgoingMessage,
    parse_json_body,
)
from delayq.stores.base import CANCELLED_GENERATION as _CANCELLED_GENERATION
from delayq.stores.key_scope import KeyScope, scoped_key

__all__ = [
    "H_DEAD_LETTER_REASON",
    "H_ERROR_MESSAGE",
    "H_ERROR_TRACE",
    "H_ERROR_TYPE",
    "H_FAILED_AT",
    "H_FIRST_FAILURE_AT",
    "H_QUEUE",
    "H_RETURNS",
    "Action",
    "DeadLetterReason",
    "Decision",
    "Delivery",
    "DeliveryLimitReached",
    "Reject",
    "Retry",
    "Undecodable",
    "bounded",
    "decode_body",
    "idempotency_key",
    "is_fresh",
]


H_ERROR_TYPE = "delayq-error-type"


H_ERROR_MESSAGE = "delayq-error-message"


H_ERROR_TRACE = "delayq-error-trace"


H_FIRST_FAILURE_AT = "delayq-first-failure-at"


H_FAILED_AT = "delayq-failed-at"


H_QUEUE = "delayq-queue"


H_DEAD_LETTER_REASON = "delayq-dead-letter-reason"


H_REPLAYS = "delayq-replays"
"""How often the message was replayed from a parking queue (absent: never)."""


H_PREVIOUS_ATTEMPTS = "delayq-previous-attempts"
"""The attempts the message used up before its latest replay, all earlier rounds summed."""


H_RETURNS = "delayq-returns"
"""Times the message went back to its queue unsettled (a crashed or cut consumer)
before a deferral republished it, which resets the broker's ``x-delivery-count``."""


class Retry(Exception):
    """Raised by a handler to be retried after ``delay`` (``timedelta`` or ``"5m"``),
    whatever the policy says; it still counts as an attempt."""

    def __init__(self, delay: object, reason: str = "retry requested by the handler") -> None:
        self.delay_ms = to_ms(delay)
        super().__init__(reason)


class Reject(Exception):
    """Raised by a handler for a message that will never succeed: straight to the DLQ."""


class Undecodable(DelayqError):
    """The body cannot be decoded for its content type, or fails the handler's model."""


class DeliveryLimitReached(DelayqError):
    """A message went back to its queue unsettled more often than its ``delivery_limit``."""


class DeadLetterReason(str, enum.Enum):
    EXHAUSTED = "exhausted"
    """The policy's attempts are spent."""
    NON_RETRYABLE = "non-retryable"
    """The handler raised ``Reject`` or an exception marked non-retryable."""
    UNDECODABLE = "undecodable"
    """The body could not be decoded or validated."""
    TOO_LONG = "delay-too-long"
    """The retry delay asked for is longer than the largest tier."""
    DELIVERY_LIMIT = "delivery-limit"
    """Returned unsettled (its consumer crashed) more often than the queue's
    ``delivery_limit``: what the broker's backstop does, kept across deferrals."""
    HANDLERS_STUCK = "handlers-stuck"
    """Its previous attempt timed out, and every handler thread of the (sync) consumer
    is stuck in a handler past its timeout: not run again there
    (:class:`~delayq.errors.HandlersStuck`)."""


class Action(str, enum.Enum):
    ACK = "ack"
    DUPLICATE = "duplicate"
    CANCELLED = "cancelled"
    """The message was cancelled (or rescheduled: this copy's generation is outdated)
    before it was handled: acked, never handled, never dead-lettered."""
    RETRY = "retry"
    DEAD_LETTER = "dead-letter"


@dataclass(frozen=True, slots=True)
class Delivery:
    """An incoming message as the core sees it, whichever client received it."""

    queue: str
    body: bytes
    routing_key: str
    message_id: str | None
    content_type: str | None
    headers: Mapping[str, Any]
    redelivered: bool = False

    @property
    def attempt(self) -> int:
        """Which delivery to a handler this is (1 for the first); bad values count as 1."""
        value = self.headers.get(H_ATTEMPT, 1)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1

    @property
    def generation(self) -> int:
        """The copy's generation (:data:`~delayq.message.envelope.H_GENERATION`): 0 when
        absent or malformed (a bool, a negative, not an int, too large), as if never
        rescheduled, so such a copy is cancelled by any reschedule of its key."""
        value = self.headers.get(H_GENERATION, 0)
        # pika decodes a 64-bit header value as its own int subclass (``long``): an int
        # all the same (a generation is epoch ms, above 2**31); a bool is not one
        if not isinstance(value, int) or isinstance(value, bool):
            return 0
        value = int(value)
        return value if 0 <= value < _CANCELLED_GENERATION else 0

    @property
    def delivery_count(self) -> int:
        """How often the broker got this message back unsettled (``x-delivery-count`` of a
        quorum queue; 1 for a redelivery that does not say)."""
        return _delivery_count(self.redelivered, self.headers)

    @property
    def returns(self) -> int:
        """Times the message went back unsettled, across deferrals (see :data:`H_RETURNS`)."""
        carried = self.headers.get(H_RETURNS, 0)
        if not isinstance(carried, int) or isinstance(carried, bool) or carried < 0:
            carried = 0
        return carried + self.delivery_count

    @property
    def origin_routing_key(self) -> str:
        """The routing key the message was first published with (retries change it)."""
        value = self.headers.get(H_ROUTING_KEY)
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        # "" is a key too: a headers namespace's publishers may send none (the exact
        # cascade would otherwise stand in its own wire key).
        if isinstance(value, str):
            return value
        # Not sent by delayq (a plugin-style publisher's, into an intake): if the broker
        # dead-lettered it, its key is now the DLQ's; the one it was published with is in
        # its oldest x-death entry.
        first = _first_routing_key(self.headers.get("x-death"))
        return self.routing_key if first is None else first


def _first_routing_key(deaths: object) -> str | None:
    """The routing key a message was published with, from its ``x-death`` entries (the
    oldest is last), if they say."""
    if not isinstance(deaths, list) or not deaths or not isinstance(deaths[-1], dict):
        return None
    keys = deaths[-1].get("routing-keys")
    if not isinstance(keys, list) or not keys:
        return None
    key = keys[0]
    if isinstance(key, (bytes, bytearray)):
        key = bytes(key).decode("utf-8", "replace")
    return key if isinstance(key, str) else None


def _delivery_count(redelivered: object, headers: Mapping[str, Any] | None) -> int:
    value = (headers or {}).get("x-delivery-count")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return 1 if redelivered else 0


def is_fresh(redelivered: object, headers: Mapping[str, Any] | None) -> bool:
    """A first delivery, not one the broker got back from a dead or stopped consumer
    (the ``redelivered`` flag, or a quorum queue's ``x-delivery-count``), nor a deferred
    copy of one (:data:`H_RETURNS`: republished while another consumer's claim on it
    lasted, it arrives as a new message but may be the one that crashes consumers)."""
    if _delivery_count(redelivered, headers) != 0:
        return False
    carried = (headers or {}).get(H_RETURNS, 0)
    return not (isinstance(carried, int) and not isinstance(carried, bool) and carried > 0)


@dataclass(frozen=True, slots=True)
class Decision:
    """The fate of one delivery; ``message`` is what to publish (and confirm) before the ack."""

    action: Action
    message: OutgoingMessage | None = None
    reason: str = ""

    @property
    def delay(self) -> timedelta | None:
        if self.message is None or self.action is not Action.RETRY:
            return None
        return self.message.receipt.delay


def bounded(text: str, limit_bytes: int, *, keep_tail: bool = False) -> str:
    """``text`` cut to at most ``limit_bytes`` of UTF-8, never inside a character."""
    data = text.encode("utf-8", "replace")
    if len(data) <= limit_bytes:
        return text
    marker = "...[cut]..."
    room = max(0, limit_bytes - len(marker))
    if keep_tail:
        return marker + data[len(data) - room :].decode("utf-8", "ignore")
    return data[:room].decode("utf-8", "ignore") + marker


def decode_body(delivery: Delivery, model: type[BaseModel] | None = None) -> Any:
    """The body for the handler: JSON decoded, text as str, else bytes; validated
    into ``model`` when given. Raises :class:`Undecodable` with the reason."""
    content_type = (delivery.content_type or CONTENT_BYTES).split(";")[0].strip().lower()
    try:
        if content_type == CONTENT_JSON or content_type.endswith("+json"):
            if model is not None:
                return model.model_validate_json(delivery.body)
            return parse_json_body(delivery.body)
        if content_type.startswith("text/"):
            value: Any = delivery.body.decode("utf-8")
        else:
            value = delivery.body
        return model.model_validate(value) if model is not None else value
    # JSONDecodeError, InvalidBody (JSON too long or deep for Python), UnicodeDecodeError too
    except (ValueError, ValidationError) as exc:
        raise Undecodable(
            f"cannot decode the {content_type} body of message {delivery.message_id!r}"
            f"{' as ' + model.__name__ if model is not None else ''}: {exc}"
        ) from exc


def idempotency_key(
    value: Any,
    delivery: Delivery,
    key: Callable[[Any], Any] | None,
    *,
    required: bool = False,
    scope: KeyScope = KeyScope.QUEUE,
) -> str | None:
    """The handler's business key for ``value`` when ``key`` is given, else the message id,
    in ``scope`` (by default the delivery's queue: see
    :class:`~delayq.stores.key_scope.KeyScope`).

    A key function must return a non-empty ``str`` (or an ``int``, or a ``UUID``):
    anything else (``None``, ``""``, bytes, an object whose ``str`` changes per call)
    would make unrelated messages share one key, or none ever match; such a message
    is :class:`Undecodable`, dead-lettered with the reason. With ``required`` (a
    transactional handler: its writes commit with the key), a message without
    either is :class:`Undecodable` too.
    """
    if key is None:
        found = delivery.message_id or None
    else:
        try:
            raw = key(value)
        except Exception as exc:
            raise Undecodable(
                f"the consumer's key function failed on message {delivery.message_id!r}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        found = _key_text(raw, delivery)
    if required and not found:
        raise Undecodable(
            "the message has no message id (and the consumer no key function): a "
            "transactional handler needs an idempotency key"
        )
    return scoped_key(found, delivery.queue, scope) if found else None


def _key_text(raw: object, delivery: Delivery) -> str:
    if isinstance(raw, uuid.UUID) or (isinstance(raw, int) and not isinstance(raw, bool)):
        return str(raw)
    if isinstance(raw, str) and raw:
        return raw
    raise Undecodable(
        f"the consumer's key function returned {raw!r} for message {delivery.message_id!r}: "
        "it must return a non-empty str (or an int or UUID), the same for every copy of "
        "the message"
    )
