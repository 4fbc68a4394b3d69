"""The delivery planner: a delivery's fate decided (done, duplicate, retry later, dead letter)
and the republished message that carries it. Pure: both consumers only perform its decisions."""

from __future__ import annotations

import random
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from delayq.consume.delivery import (
    H_DEAD_LETTER_REASON,
    H_ERROR_MESSAGE,
    H_ERROR_TRACE,
    H_ERROR_TYPE,
    H_FAILED_AT,
    H_FIRST_FAILURE_AT,
    H_PREVIOUS_ATTEMPTS,
    H_QUEUE,
    H_REPLAYS,
    H_RETURNS,
    Action,
    DeadLetterReason,
    Decision,
    Delivery,
    DeliveryLimitReached,
    Reject,
    Retry,
    bounded,
)
from delayq.consume.retry import RetryPolicy, check_policy, default_policy
from delayq.errors import DelayTooLong, HandlersStuck, InvalidHeaders, InvalidInput
from delayq.message.envelope import (
    CONTENT_BYTES,
    H_GENERATION,
    HEADER_PREFIX,
    OutgoingMessage,
    Receipt,
    envelope_headers,
    epoch_ms,
)
from delayq.message.limits import ERROR_TYPE_MAX_BYTES, FRAME_MAX, PROPERTIES_RESERVED_BYTES
from delayq.message.validate import headers_size
from delayq.scrub import SCRUB_WINDOW_CHARS, Scrubber, scrubbing
from delayq.topology.ladder import Tier
from delayq.topology.model import Topology
from delayq.topology.route import Router, Wait

__all__ = [
    "MAX_ERROR_MESSAGE_BYTES",
    "MAX_ERROR_TRACE_BYTES",
    "DeliveryPlanner",
    "fit_headers",
    "republished",
]


MAX_ERROR_MESSAGE_BYTES = 1024


MAX_ERROR_TRACE_BYTES = 8192
"""Header frames must fit in the negotiated frame size (128 KiB by default): an
unbounded traceback, as some frameworks send, can make the republish fail."""


_SUCCESS = Decision(Action.ACK)
"""Every success's decision: decisions are immutable, one will do."""
_CANCELLED = Decision(Action.CANCELLED, reason="cancelled")

_CARRIED = (
    H_FIRST_FAILURE_AT,
    H_ERROR_TYPE,
    H_ERROR_MESSAGE,
    H_FAILED_AT,
    H_GENERATION,
    H_REPLAYS,
    H_PREVIOUS_ATTEMPTS,
)
"""delayq's headers a retry keeps: an earlier failure's record, the copy's generation
(a retry of a rescheduled copy is that copy, not an older one) and its replay history."""

_KEPT_IN_DLQ = (H_GENERATION, H_REPLAYS, H_PREVIOUS_ATTEMPTS)
"""delayq's headers a dead letter keeps: a replay from the DLQ is that copy again, and
its history goes on counting."""


def _user_headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    """Headers the application set: delayq's and the broker's are replaced, never stacked."""
    return {
        k: v
        for k, v in headers.items()
        if not k.lower().startswith(HEADER_PREFIX) and not k.lower().startswith("x-")
    }


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
            if topology.destination(queue).existing:
                raise InvalidInput(
                    f"queue {queue!r} is an existing queue the topology only binds "
                    "(existing: true): it has no DLQ or retry binding of delayq's; consume "
                    "it with your own consumer, or make it a delayq destination"
                )
        except KeyError:
            raise InvalidInput(
                f"queue {queue!r} is not a destination of the topology (namespace "
                f"{topology.namespace!r}); add it under `destinations`"
            ) from None
        self.topology = topology
        self._router = Router(topology)
        self.queue = queue
        self._delivery_limit = topology.destination(queue).delivery_limit  # read per delivery
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

    def cancelled(self) -> Decision:
        """Its key is cancelled, or this copy's generation is outdated: ack, never handle."""
        return _CANCELLED

    def undecodable(self, delivery: Delivery, error: BaseException) -> Decision:
        return self._dead_letter(delivery, DeadLetterReason.UNDECODABLE, error, None)

    def failure(
        self, delivery: Delivery, error: BaseException, trace: str | None = None
    ) -> Decision:
        """Retry later, or dead-letter when non-retryable or when the attempts are spent."""
        if trace is None:
            trace = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        if isinstance(error, HandlersStuck):
            return self._dead_letter(delivery, DeadLetterReason.HANDLERS_STUCK, error, trace)
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
        failure = self._failure_headers(delivery, error, trace, now)
        message.headers.update(failure)
        # The log line says what failed, not only that something did (scrubbed and cut).
        reason = f"attempt {attempt} failed: {type(error).__name__}: {failure[H_ERROR_MESSAGE]}"
        return Decision(Action.RETRY, message, reason=reason)

    def deferred(self, delivery: Delivery, *, here: bool = False, by_key: bool = False) -> Decision:
        """The key's claim is held (``here``: by this consumer, for another copy it handles
        now; else elsewhere: another consumer, or one that stopped and left its claim
        until the lease ends): come back after the smallest tier, without counting an
        attempt (the holder may still fail). ``by_key``: the key is a business key, not
        the message id. The reason says which.

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
        return Decision(Action.RETRY, message, reason=_deferral(here=here, by_key=by_key))

    def over_delivery_limit(self, delivery: Delivery) -> Decision | None:
        """Dead-letter ``delivery`` if it went back unsettled more often than the queue's
        ``delivery_limit``, counting returns carried across deferrals; else ``None``."""
        limit = self._delivery_limit
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
        exchange, routing_key, wait = self._router.to_queue(
            delay_ms, self.queue, delivery.message_id or ""
        )
        headers = _user_headers(delivery.headers)
        headers.update(
            envelope_headers(
                delay_ms, wait.label, wait.ms, now, attempt, delivery.origin_routing_key
            )
        )
        for key in _CARRIED:
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
        for key in _KEPT_IN_DLQ:
            if key in delivery.headers:
                headers[key] = delivery.headers[key]
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


def _deferral(*, here: bool, by_key: bool) -> str:
    """Why a delivery was deferred: whose claim holds its key, as far as the consumer knows
    (the stores record no owner; a consumer knows the claims it holds itself)."""
    other = (
        "another message with the same business key"
        if by_key
        else "another copy of this message (same message id)"
    )
    if here:
        return f"{other} is being handled by this consumer right now (it holds the key's claim)"
    return (
        f"the key's claim is held elsewhere: another consumer is handling {other}, or one "
        "that stopped left the claim until its lease ends"
    )


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
