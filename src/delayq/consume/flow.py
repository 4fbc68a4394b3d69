"""One delivery's way from arrival to settlement, written once, without I/O.

:func:`delivery_flow` is a generator in the style of h11 and httpx's auth flows:
it decides, the consumer performs. It *yields* the steps it needs done and is
*sent* what came of each; it *returns* how the delivery is settled. The sync,
asyncio and memory consumers only drive it (see :func:`advance`), each with its
own I/O, so the order of the steps (decode, key, claim, handler, release or
complete, decide, republish, ack) exists in one place.

Steps and their answers:

======================================  =============================================
step yielded                            answer sent back
======================================  =============================================
:class:`~delayq.stores.base.Claim`      a :class:`~delayq.stores.base.ClaimStatus`,
                                        or the :class:`~delayq.errors.StoreError`
:class:`~delayq.stores.base.Complete`   ``None`` or the ``StoreError``
:class:`~delayq.stores.base.Release`    ``None`` or the ``StoreError``
:class:`RunHandler`                     :class:`HandlerEnded` (what it raised, if anything)
:class:`Publish`                        ``None`` once confirmed, or the ``DelayqError``
======================================  =============================================

Settlements returned: :class:`Ack` (ack the delivery: its fate is safe),
:class:`PutBack` (return it to the queue unacked, its fate could not be made safe
now) and :class:`GiveUp` (the handler raised a ``BaseException`` that is not an
``Exception``: the consumer stops or the task is cancelled; the delivery goes back
with the channel). Nothing is acked before its republish is confirmed and its key
recorded: a crash between two steps can only duplicate, which the key absorbs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from delayq.consume.delivery import Decision, Delivery, Undecodable, decode_body, idempotency_key
from delayq.consume.planner import DeliveryPlanner
from delayq.errors import DelayqError, StoreError
from delayq.message.envelope import OutgoingMessage
from delayq.stores.base import Claim, ClaimStatus, Complete, Release
from delayq.stores.key_scope import KeyScope

__all__ = [
    "Ack",
    "Answer",
    "Flow",
    "FlowContext",
    "GiveUp",
    "HandlerEnded",
    "Publish",
    "PutBack",
    "RunHandler",
    "Settlement",
    "Step",
    "advance",
    "delivery_flow",
]

log = logging.getLogger("delayq.consumer")


@dataclass(slots=True)
class RunHandler:
    """Run the handler on ``value``. ``claim`` is the claim held for its key (``None``:
    no store, or no key); a transactional handler commits that key with its writes."""

    value: Any
    claim: Claim | None


@dataclass(slots=True)
class HandlerEnded:
    """What the handler did: ``error`` is what it raised (a timeout included), or ``None``."""

    error: BaseException | None = None
    handler_ms: float | None = None


@dataclass(slots=True)
class Publish:
    """Publish ``message`` (a retry or a dead letter) and wait for the broker's confirm."""

    message: OutgoingMessage


@dataclass(slots=True)
class Ack:
    """Ack the delivery: ``decision`` is done (its republish confirmed, its key recorded)."""

    decision: Decision
    handler_ms: float | None = None


@dataclass(slots=True)
class PutBack:
    """Return the delivery to its queue unacked; ``why`` is logged."""

    why: str


@dataclass(slots=True)
class GiveUp:
    """The handler raised ``error`` (``SystemExit``, ``KeyboardInterrupt``, a cancel):
    its claim is given back, the delivery is not settled, the consumer re-raises."""

    error: BaseException


Step = Claim | Complete | Release | RunHandler | Publish
Answer = ClaimStatus | HandlerEnded | DelayqError | None
Settlement = Ack | PutBack | GiveUp
Flow = Generator[Step | Settlement, Answer, None]
"""The flow's last item is its settlement, after which it must not be sent anything:
yielded rather than returned, so a delivery costs no ``StopIteration``."""


@dataclass(frozen=True, slots=True)
class FlowContext:
    """What the flow needs of its consumer: the planner and the keying options."""

    planner: DeliveryPlanner
    model: type[BaseModel] | None
    key: Callable[[Any], Any] | None
    key_scope: KeyScope
    keyed_store: bool
    """Whether the consumer has an idempotency store (a delivery with a key claims it)."""
    transactional: bool
    lease_ms: int
    clock_ms: Callable[[], int]
    held: set[str] = field(default_factory=set)
    """The keys this consumer's flows hold claims on now: a key found busy is then held
    for another copy this consumer handles, not by another consumer."""


def delivery_flow(delivery: Delivery, ctx: FlowContext) -> Flow:
    """The steps for ``delivery``, ending with its settlement (see the module's docstring)."""
    planner = ctx.planner
    try:
        value = decode_body(delivery, ctx.model)
        key = idempotency_key(
            value, delivery, ctx.key, required=ctx.transactional, scope=ctx.key_scope
        )
    except Undecodable as exc:
        yield from _settle(planner.undecodable(delivery, exc))
        return
    limited = planner.over_delivery_limit(delivery)
    if limited is not None:  # crashed its consumers too often (see delivery.H_RETURNS)
        yield from _settle(limited)
        return
    claim: Claim | None = None
    if ctx.keyed_store and key is not None:
        # The cancel check rides on the claim: the store answers CANCELLED for a cancelled
        # key, or for a copy older than the key's generation (see docs/concepts/cancel.md).
        claim = Claim(key, ctx.lease_ms, ctx.clock_ms(), delivery.generation)
        status = yield claim
        if status is not ClaimStatus.CLAIMED:
            if status is ClaimStatus.DONE:
                yield from _settle(planner.duplicate())
            elif status is ClaimStatus.CANCELLED:
                log.info("skipping %s: cancelled (key %r)", delivery.message_id, key)
                yield from _settle(planner.cancelled())
            elif status is ClaimStatus.BUSY:
                here, by_key = claim.key in ctx.held, ctx.key is not None
                yield from _settle(planner.deferred(delivery, here=here, by_key=by_key))
            else:
                yield PutBack(f"claiming its key failed: {status}")
            return
        ctx.held.add(claim.key)
    try:
        yield from _handle(delivery, ctx, value, claim)
    finally:  # a flow closed early (the consumer stopped) holds nothing either
        if claim is not None:
            ctx.held.discard(claim.key)


def _handle(delivery: Delivery, ctx: FlowContext, value: Any, claim: Claim | None) -> Flow:
    """The handler's run and what follows it; ``claim`` (if any) is held, and no longer
    counted as this consumer's once it is released or recorded."""
    planner = ctx.planner
    ended = yield RunHandler(value, claim)
    assert type(ended) is HandlerEnded, ended
    error = ended.error
    if error is not None:
        if claim is not None:
            # Given back so a retry can claim it at once; if this fails, the claim's
            # lease ends by itself (and the retry is deferred until then).
            released = yield Release(claim.key)
            ctx.held.discard(claim.key)
            if isinstance(released, StoreError):
                log.warning("releasing key %r failed: %s", claim.key, released)
        if not isinstance(error, Exception):
            yield GiveUp(error)
            return
        yield from _settle(planner.failure(delivery, error), ended.handler_ms)
        return
    if claim is not None and not ctx.transactional:  # a transaction recorded it already
        recorded = yield Complete(claim.key, ctx.clock_ms())
        ctx.held.discard(claim.key)
        if recorded is not None:
            yield PutBack(f"recording its key as done failed: {recorded}")
            return
    if claim is not None:
        ctx.held.discard(claim.key)
    yield Ack(planner.success(), ended.handler_ms)


def _settle(decision: Decision, handler_ms: float | None = None) -> Flow:
    """Republish (confirmed) what ``decision`` sends on, then ack; put back if refused."""
    if decision.message is not None:
        refused = yield Publish(decision.message)
        if refused is not None:
            # Not safely elsewhere: back to the queue (the broker's delivery limit
            # dead-letters it if this keeps happening).
            yield PutBack(f"its republish was not confirmed: {refused}")
            return
    yield Ack(decision, handler_ms)


def advance(flow: Flow, answer: Answer) -> Step | Settlement:
    """Send ``answer`` to ``flow``: its next step, or its settlement (its last item)."""
    return flow.send(answer)
