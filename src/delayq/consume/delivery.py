"""What to do with a delivery: the pure decisions both consumers only perform.

A delivery ends in exactly one of: done (ack), duplicate (ack, counted), retry
later (publish to the retry tier for the policy's next delay, addressed to the
failing queue alone, then ack), or dead-lettered (publish to ``<queue>.dlq``
with the reason, then ack). The republish is confirmed before the ack, so a
crash between the two can only duplicate, which the idempotency store absorbs.
"""

from __future__ import annotations

import enum
import json
import random
import traceback
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ValidationError

from delayq.consume.retry import RetryPolicy, check_policy, default_policy
from delayq.durations import to_ms
from delayq.errors import DelayqError, DelayTooLong, InvalidHeaders, InvalidInput
from delayq.message.envelope import (
    CONTENT_BYTES,
    CONTENT_JSON,
    H_ATTEMPT,
    H_ROUTING_KEY,
    HEADER_PREFIX,
    OutgoingMessage,
    Receipt,
    envelope_headers,
    epoch_ms,
    headers_size,
)
from delayq.message.limits import ERROR_TYPE_MAX_BYTES, FRAME_MAX, PROPERTIES_RESERVED_BYTES
from delayq.scrub import SCRUB_WINDOW_CHARS, Scrubber, scrubbing
from delayq.stores.key_scope import KeyScope, scoped_key
from delayq.topology.ladder import Tier
from delayq.topology.model import Topology
from delayq.topology.route import Router, Wait

__all__ = [
    "H_DEAD_LETTER_REASON",
    "H_ERROR_MESSAGE",
    "H_ERROR_TRACE",
    "H_ERROR_TYPE",
    "H_FAILED_AT",
    "H_FIRST_FAILURE_AT",
    "H_QUEUE",
    "H_RETURNS",
    "MAX_ERROR_MESSAGE_BYTES",
    "MAX_ERROR_TRACE_BYTES",
    "RECONNECT_MAX_S",
    "RECONNECT_MIN_S",
    "STALL_CHECK_S",
    "Action",
    "ConsumeSettings",
    "DeadLetterReason",
    "Decision",
    "Delivery",
    "DeliveryLimitReached",
    "DeliveryPlanner",
    "Reject",
    "Retry",
    "Undecodable",
    "bounded",
    "check_concurrency",
    "decode_body",
    "fit_headers",
    "idempotency_key",
    "is_fresh",
    "republished",
]

H_ERROR_TYPE = "delayq-error-type"
H_ERROR_MESSAGE = "delayq-error-message"
H_ERROR_TRACE = "delayq-error-trace"
H_FIRST_FAILURE_AT = "delayq-first-failure-at"
H_FAILED_AT = "delayq-failed-at"
H_QUEUE = "delayq-queue"
H_DEAD_LETTER_REASON = "delayq-dead-letter-reason"
H_RETURNS = "delayq-returns"
"""Times the message went back to its queue unsettled (a crashed or cut consumer)
before a deferral republished it, which resets the broker's ``x-delivery-count``."""

RECONNECT_MIN_S = 0.5
RECONNECT_MAX_S = 10.0
"""A consumer's back-off between attempts to reopen a lost connection (doubling, capped)."""

STALL_CHECK_S = 10.0
"""A consumer idle this long while its queue holds ready messages re-subscribes."""

MAX_ERROR_MESSAGE_BYTES = 1024
MAX_ERROR_TRACE_BYTES = 8192
"""Header frames must fit in the negotiated frame size (128 KiB by default): an
unbounded traceback, as some frameworks send, can make the republish fail."""


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


class Action(str, enum.Enum):
    ACK = "ack"
    DUPLICATE = "duplicate"
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
        return value if isinstance(value, str) and value else self.routing_key


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


_SUCCESS = Decision(Action.ACK)
"""Every success's decision: decisions are immutable, one will do."""


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
            return json.loads(delivery.body)
        if content_type.startswith("text/"):
            value: Any = delivery.body.decode("utf-8")
        else:
            value = delivery.body
        return model.model_validate(value) if model is not None else value
    except (ValueError, ValidationError) as exc:  # JSONDecodeError, UnicodeDecodeError too
        raise Undecodable(
            f"cannot decode the {content_type} body of message {delivery.message_id!r}"
            f"{' as ' + model.__name__ if model is not None else ''}: {exc}"
        ) from exc


def _user_headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    """Headers the application set: delayq's and the broker's are replaced, never stacked."""
    return {
        k: v
        for k, v in headers.items()
        if not k.lower().startswith(HEADER_PREFIX) and not k.lower().startswith("x-")
    }


@dataclass(frozen=True, slots=True)
class ConsumeSettings:
    """A consumer's validated knobs, the same for both adapters."""

    prefetch: int
    handler_timeout_ms: int
    lease_ms: int
    """How long a claim holds a key: past the handler's timeout, so only a crash lets
    it lapse before the handler is done."""
    retention_ms: int = 7 * 86_400_000
    """How long a completed key is remembered (duplicates later than this run again)."""
    prune_every_ms: int = 600_000
    concurrency: int | None = None
    """Handlers running at once (``None``: the adapter's default); at most ``prefetch``."""

    @classmethod
    def parse(
        cls,
        *,
        prefetch: int,
        handler_timeout: object,
        lease: object = None,
        retention: object = "7d",
        concurrency: object = None,
    ) -> ConsumeSettings:
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
            raise InvalidInput(f"prefetch must be an int of at least 1, got {prefetch!r}")
        checked = check_concurrency(concurrency, prefetch)
        timeout_ms = to_ms(handler_timeout, what="handler_timeout")
        if timeout_ms <= 0:
            raise InvalidInput("handler_timeout must be longer than 0")
        lease_ms = timeout_ms + 60_000 if lease is None else to_ms(lease, what="lease")
        if lease_ms <= timeout_ms:
            raise InvalidInput("lease must be longer than handler_timeout")
        retention_ms = to_ms(retention, what="retention")
        if retention_ms < lease_ms:
            raise InvalidInput("retention must be at least as long as the claim's lease")
        prune_every_ms = max(1_000, min(600_000, retention_ms // 10))
        return cls(prefetch, timeout_ms, lease_ms, retention_ms, prune_every_ms, checked)


def check_concurrency(concurrency: object, prefetch: int) -> int | None:
    """``concurrency`` if it is ``None`` or an int from 1 to ``prefetch``, else
    :class:`~delayq.errors.InvalidInput` saying what to change."""
    if concurrency is None:
        return None
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise InvalidInput(
            f"concurrency must be an int of at least 1 (handlers running at once), "
            f"got {concurrency!r}"
        )
    if concurrency > prefetch:
        # Only prefetched deliveries can run: more would be a promise not kept.
        raise InvalidInput(
            f"concurrency {concurrency} is more than prefetch {prefetch}: a consumer runs "
            "at most as many handlers as it has deliveries; raise prefetch or lower concurrency"
        )
    return concurrency


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


class DeliveryPlanner:
    """Decides the fate of deliveries from one queue; pure, with injectable clock and rng."""

    def __init__(
        self,
        topology: Topology,
        queue: str,
        *,
        policy: RetryPolicy | None = None,
        non_retryable: tuple[type[BaseException], ...] = (),
        clock_ms: Callable[[], int] = epoch_ms,
        rng: random.Random | None = None,
        scrubber: Scrubber | None = None,
    ) -> None:
        try:
            topology.destination(queue)
        except KeyError:
            raise InvalidInput(
                f"queue {queue!r} is not a destination of the topology (namespace "
                f"{topology.namespace!r}); add it under `destinations`"
            ) from None
        self.topology = topology
        self._router = Router(topology)
        self.queue = queue
        self.dlq = f"{queue}.dlq"
        if policy is None:
            policy = default_policy(topology)
        elif not isinstance(policy, RetryPolicy):
            raise InvalidInput(
                f'policy must be a retry policy such as ExponentialBackoff(initial="30s"), '
                f"not {policy!r}"
            )
        else:
            # Refused now rather than dead-lettered as delay-too-long at the first long retry.
            check_policy(policy, topology, queue=queue)
        self.policy = policy
        self.non_retryable: tuple[type[BaseException], ...] = (Reject, *non_retryable)
        self._clock_ms = clock_ms
        self._rng = rng if rng is not None else random.Random()
        self._scrub = scrubbing(scrubber)

    def _clean(self, text: str, limit_bytes: int, *, keep_tail: bool = False) -> str:
        """``text`` scrubbed of credentials (see :mod:`delayq.scrub`), then cut to fit.

        Error text goes into headers, the decision's reason, logs and records only
        through here. Only a window of it is scrubbed, far larger than what is kept.
        """
        window = text[-SCRUB_WINDOW_CHARS:] if keep_tail else text[:SCRUB_WINDOW_CHARS]
        return bounded(self._scrub(window), limit_bytes, keep_tail=keep_tail)

    def success(self) -> Decision:
        return _SUCCESS

    def duplicate(self) -> Decision:
        return Decision(Action.DUPLICATE, reason="already handled")

    def undecodable(self, delivery: Delivery, error: BaseException) -> Decision:
        return self._dead_letter(delivery, DeadLetterReason.UNDECODABLE, error, None)

    def failure(
        self, delivery: Delivery, error: BaseException, trace: str | None = None
    ) -> Decision:
        """Retry later, or dead-letter when non-retryable or when the attempts are spent."""
        if trace is None:
            trace = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        if isinstance(error, self.non_retryable):
            return self._dead_letter(delivery, DeadLetterReason.NON_RETRYABLE, error, trace)
        attempt = delivery.attempt
        if isinstance(error, Retry):
            delay_ms: int | None = error.delay_ms
            if attempt >= self.policy.max_attempts:
                delay_ms = None
        else:
            delay_ms = self.policy.delay_ms(attempt, self._rng)
        if delay_ms is None:
            return self._dead_letter(delivery, DeadLetterReason.EXHAUSTED, error, trace)
        now = self._clock_ms()
        try:
            message = self._retry_message(delivery, delay_ms, attempt + 1, now)
        except DelayTooLong as exc:
            return self._dead_letter(delivery, DeadLetterReason.TOO_LONG, exc, trace)
        message.headers.update(self._failure_headers(delivery, error, trace, now))
        return Decision(Action.RETRY, message, reason=f"attempt {attempt} failed")

    def deferred(self, delivery: Delivery) -> Decision:
        """Another consumer holds this key's claim: come back after the smallest tier,
        without counting an attempt (the other consumer may still fail).

        The republished copy starts with a fresh broker delivery count, so the returns
        so far travel in :data:`H_RETURNS`: a message whose handler keeps crashing the
        process leaves its claim behind each time and would otherwise be deferred
        forever, never reaching the queue's ``delivery_limit``.
        """
        limited = self.over_delivery_limit(delivery)
        if limited is not None:
            return limited
        tier = self.topology.ladder.tiers[0]
        message = self._retry_message(delivery, tier.ttl_ms, delivery.attempt, self._clock_ms())
        if delivery.returns:
            message.headers[H_RETURNS] = delivery.returns
        return Decision(Action.RETRY, message, reason="claimed by another consumer")

    def over_delivery_limit(self, delivery: Delivery) -> Decision | None:
        """Dead-letter ``delivery`` if it went back unsettled more often than the queue's
        ``delivery_limit``, counting returns carried across deferrals; else ``None``."""
        limit = self.topology.destination(self.queue).delivery_limit
        returns = delivery.returns
        if returns <= limit:
            return None
        error = DeliveryLimitReached(
            f"message {delivery.message_id!r} went back to {self.queue!r} unsettled "
            f"{returns} times (its handler keeps crashing the consumer?); the queue's "
            f"delivery_limit is {limit}"
        )
        return self._dead_letter(delivery, DeadLetterReason.DELIVERY_LIMIT, error, None)

    def _retry_message(
        self, delivery: Delivery, delay_ms: int, attempt: int, now: int
    ) -> OutgoingMessage:
        """The retry, addressed to this queue alone, by the topology's default strategy.

        Raises :class:`~delayq.errors.DelayTooLong` when the strategy cannot wait that long.
        """
        exchange, routing_key, wait = self._router.to_queue(delay_ms, self.queue)
        headers = _user_headers(delivery.headers)
        headers.update(
            envelope_headers(
                delay_ms, wait.label, wait.ms, now, attempt, delivery.origin_routing_key
            )
        )
        for key in (H_FIRST_FAILURE_AT, H_ERROR_TYPE, H_ERROR_MESSAGE, H_FAILED_AT):
            if key in delivery.headers:  # an earlier failure's record travels on
                headers[key] = delivery.headers[key]
        return republished(
            delivery,
            exchange,
            routing_key,
            headers,
            now,
            delay_ms,
            wait,
            frame_max=self.topology.limits.frame_max,
        )

    def _failure_headers(
        self, delivery: Delivery, error: BaseException, trace: str | None, now: int
    ) -> dict[str, Any]:
        first = delivery.headers.get(H_FIRST_FAILURE_AT)
        headers: dict[str, Any] = {
            H_ERROR_TYPE: bounded(
                f"{type(error).__module__}.{type(error).__qualname__}", ERROR_TYPE_MAX_BYTES
            ),
            H_ERROR_MESSAGE: self._clean(_error_text(error), MAX_ERROR_MESSAGE_BYTES),
            H_FIRST_FAILURE_AT: first if isinstance(first, int) else now,
            H_FAILED_AT: now,
            H_QUEUE: self.queue,
        }
        if trace:
            headers[H_ERROR_TRACE] = self._clean(trace, MAX_ERROR_TRACE_BYTES, keep_tail=True)
        return headers

    def _dead_letter(
        self,
        delivery: Delivery,
        reason: DeadLetterReason,
        error: BaseException,
        trace: str | None,
    ) -> Decision:
        now = self._clock_ms()
        headers = _user_headers(delivery.headers)
        headers.update(
            envelope_headers(0, None, 0, now, delivery.attempt, delivery.origin_routing_key)
        )
        failure = self._failure_headers(delivery, error, trace, now)
        headers.update(failure)
        headers[H_DEAD_LETTER_REASON] = reason.value
        message = republished(
            delivery,
            self.topology.direct_exchange,
            self.dlq,
            headers,
            now,
            0,
            None,
            frame_max=self.topology.limits.frame_max,
        )
        # The reason reaches logs, delivery records and observers: scrubbed and cut too.
        return Decision(
            Action.DEAD_LETTER, message, reason=f"{reason.value}: {failure[H_ERROR_MESSAGE]}"
        )


def _error_text(error: BaseException) -> str:
    """``str(error)``, or a placeholder when the exception's ``__str__`` itself fails."""
    try:
        return str(error)
    except Exception:
        return f"<{type(error).__name__}: str() failed>"


def fit_headers(headers: dict[str, Any], frame_max: int = FRAME_MAX) -> dict[str, Any]:
    """``headers``, made to fit one content-header frame of ``frame_max`` bytes.

    A message published through delayq always fits (its limits keep room for
    delayq's headers). One published by another client with headers near the
    frame size would make the republish fail, so it loses the error trace
    first, then most of the error message. Headers of types delayq does not
    send (floats, decimals, timestamps from other clients) cannot be measured
    here and go on as they are.
    """
    budget = frame_max - PROPERTIES_RESERVED_BYTES
    try:
        if headers_size(headers) <= budget:
            return headers
        headers.pop(H_ERROR_TRACE, None)
        message = headers.get(H_ERROR_MESSAGE)
        if isinstance(message, str) and headers_size(headers) > budget:
            headers[H_ERROR_MESSAGE] = bounded(message, 128)
    except InvalidHeaders:
        pass
    return headers


def republished(
    delivery: Delivery,
    exchange: str,
    routing_key: str,
    headers: dict[str, Any],
    now: int,
    delay_ms: int = 0,
    wait: Wait | Tier | None = None,
    *,
    frame_max: int = FRAME_MAX,
) -> OutgoingMessage:
    """``delivery`` sent on again (same id, body and content type) with new headers,
    fitted into one frame of ``frame_max`` bytes (see :func:`fit_headers`)."""
    headers = fit_headers(headers, frame_max)
    message_id = delivery.message_id or f"delayq-unnamed-{now}"
    if not isinstance(wait, Wait):
        wait = Wait.of_tier(wait)
    return OutgoingMessage(
        exchange=exchange,
        routing_key=routing_key,
        body=delivery.body,
        content_type=delivery.content_type or CONTENT_BYTES,
        message_id=message_id,
        timestamp_s=now // 1000,
        headers=headers,
        receipt=Receipt(
            message_id=message_id,
            routing_key=routing_key,
            exchange=exchange,
            tier=wait.label,
            delay_ms=delay_ms,
            tier_ms=wait.ms,
            published_at_ms=now,
            strategy=wait.strategy,
            hops=wait.hops,
        ),
    )
