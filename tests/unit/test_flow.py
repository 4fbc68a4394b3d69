"""The delivery flow stepped by hand: every branch, no broker, no fake client.

Each test drives :func:`delayq.consume.flow.delivery_flow` the way a consumer does,
answering its steps, and checks the steps it asked for and its settlement.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel

from delayq import ExponentialBackoff, Reject, Topology
from delayq.consume.delivery import H_DEAD_LETTER_REASON, Action, Delivery
from delayq.consume.flow import (
    Ack,
    Answer,
    FlowContext,
    GiveUp,
    HandlerEnded,
    Publish,
    PutBack,
    RunHandler,
    Settlement,
    Step,
    advance,
    delivery_flow,
)
from delayq.consume.planner import DeliveryPlanner
from delayq.errors import HandlerTimeout, PublishError, StoreError
from delayq.stores.base import Claim, ClaimStatus, Complete, Release
from delayq.stores.key_scope import KeyScope

TOPOLOGY = Topology(
    namespace="fl",
    ladder=["1s", "10s"],
    destinations=[{"queue": "work", "bindings": ["job.#"], "delivery_limit": 3}],
)
NOW = 1_000_000


def _context(
    *,
    store: bool = True,
    transactional: bool = False,
    model: type[BaseModel] | None = None,
    key: Callable[[Any], Any] | None = None,
) -> FlowContext:
    planner = DeliveryPlanner(
        TOPOLOGY,
        "work",
        policy=ExponentialBackoff(initial="1s", max_attempts=3),
        clock_ms=lambda: NOW,
    )
    return FlowContext(
        planner=planner,
        model=model,
        key=key,
        key_scope=KeyScope.QUEUE,
        keyed_store=store,
        transactional=transactional,
        lease_ms=60_000,
        clock_ms=lambda: NOW,
    )


def _delivery(
    body: bytes = b'{"id": 7}',
    *,
    message_id: str | None = "m-1",
    headers: dict[str, Any] | None = None,
    content_type: str = "application/json",
) -> Delivery:
    return Delivery(
        queue="work",
        body=body,
        routing_key="job.a",
        message_id=message_id,
        content_type=content_type,
        headers=headers or {},
    )


def _walk(
    ctx: FlowContext, delivery: Delivery, answers: Callable[[Step], Answer]
) -> tuple[list[Step], Settlement]:
    """Drive the flow to its end; ``answers`` answers each step. Returns (steps, settlement)."""
    flow = delivery_flow(delivery, ctx)
    steps: list[Step] = []
    answer: Answer = None
    for _ in range(20):
        step = advance(flow, answer)
        if isinstance(step, (Ack, PutBack, GiveUp)):
            return steps, step
        steps.append(step)
        answer = answers(step)
    raise AssertionError(f"the flow did not end: {steps}")


def _answers(
    *,
    claim: ClaimStatus | StoreError = ClaimStatus.CLAIMED,
    handler: BaseException | None = None,
    complete: StoreError | None = None,
    release: StoreError | None = None,
    publish: PublishError | None = None,
) -> Callable[[Step], Answer]:
    def answer(step: Step) -> Answer:
        if isinstance(step, Claim):
            return claim
        if isinstance(step, RunHandler):
            return HandlerEnded(handler, 12.5)
        if isinstance(step, Complete):
            return complete
        if isinstance(step, Release):
            return release
        assert isinstance(step, Publish)
        return publish

    return answer


def _kinds(steps: list[Step]) -> list[str]:
    return [type(step).__name__ for step in steps]


def test_success_claims_runs_completes_then_acks() -> None:
    steps, end = _walk(_context(), _delivery(), _answers())
    assert _kinds(steps) == ["Claim", "RunHandler", "Complete"]
    claim = steps[0]
    assert isinstance(claim, Claim) and claim.key == "q:work:m-1"
    assert claim.lease_until_ms == NOW + 60_000
    run = steps[1]
    assert isinstance(run, RunHandler) and run.value == {"id": 7} and run.claim == claim
    assert isinstance(end, Ack) and end.decision.action is Action.ACK and end.handler_ms == 12.5


def test_without_a_store_only_the_handler_runs() -> None:
    steps, end = _walk(_context(store=False), _delivery(), _answers())
    assert _kinds(steps) == ["RunHandler"]
    run = steps[0]
    assert isinstance(run, RunHandler) and run.claim is None
    assert isinstance(end, Ack) and end.decision.action is Action.ACK


def test_a_message_without_id_or_key_function_is_not_claimed() -> None:
    steps, end = _walk(_context(), _delivery(message_id=None), _answers())
    assert _kinds(steps) == ["RunHandler"]
    assert isinstance(end, Ack)


def test_the_key_function_names_the_claim() -> None:
    steps, _ = _walk(_context(key=lambda body: body["id"]), _delivery(), _answers())
    claim = steps[0]
    assert isinstance(claim, Claim) and claim.key == "q:work:7"


def test_undecodable_is_dead_lettered_without_claim_or_handler() -> None:
    steps, end = _walk(_context(), _delivery(b"{not json"), _answers())
    assert _kinds(steps) == ["Publish"]
    publish = steps[0]
    assert isinstance(publish, Publish)
    assert publish.message.routing_key == "work.dlq"
    assert publish.message.headers[H_DEAD_LETTER_REASON] == "undecodable"
    assert isinstance(end, Ack) and end.decision.action is Action.DEAD_LETTER


def test_a_model_that_refuses_the_body_is_undecodable() -> None:
    class Order(BaseModel):
        sku: str

    steps, end = _walk(_context(model=Order), _delivery(), _answers())
    assert _kinds(steps) == ["Publish"]
    assert isinstance(end, Ack) and end.decision.action is Action.DEAD_LETTER


def test_a_key_function_that_fails_is_undecodable() -> None:
    steps, end = _walk(_context(key=lambda body: body["missing"]), _delivery(), _answers())
    assert _kinds(steps) == ["Publish"]
    assert isinstance(end, Ack) and end.decision.action is Action.DEAD_LETTER


def test_transactional_without_a_key_is_undecodable() -> None:
    ctx = _context(transactional=True)
    steps, end = _walk(ctx, _delivery(message_id=None), _answers())
    assert _kinds(steps) == ["Publish"]
    assert isinstance(end, Ack) and end.decision.action is Action.DEAD_LETTER


def test_over_the_delivery_limit_is_dead_lettered_before_the_claim() -> None:
    delivery = _delivery(headers={"x-delivery-count": 4})
    steps, end = _walk(_context(), delivery, _answers())
    assert _kinds(steps) == ["Publish"]
    publish = steps[0]
    assert isinstance(publish, Publish)
    assert publish.message.headers[H_DEAD_LETTER_REASON] == "delivery-limit"
    assert isinstance(end, Ack) and end.decision.action is Action.DEAD_LETTER


def test_a_duplicate_is_acked_without_running_the_handler() -> None:
    steps, end = _walk(_context(), _delivery(), _answers(claim=ClaimStatus.DONE))
    assert _kinds(steps) == ["Claim"]
    assert isinstance(end, Ack) and end.decision.action is Action.DUPLICATE


def test_a_busy_key_is_deferred_to_the_smallest_tier() -> None:
    steps, end = _walk(_context(), _delivery(), _answers(claim=ClaimStatus.BUSY))
    assert _kinds(steps) == ["Claim", "Publish"]
    publish = steps[1]
    assert isinstance(publish, Publish) and publish.message.receipt.tier == "1s"
    assert isinstance(end, Ack) and end.decision.action is Action.RETRY


def test_a_busy_key_held_elsewhere_says_so_not_this_consumer() -> None:
    """Issue 29: "claimed by another consumer" was said also when this very consumer held
    the claim for another copy. Nothing of this consumer holds it here."""
    _, end = _walk(_context(), _delivery(), _answers(claim=ClaimStatus.BUSY))
    assert isinstance(end, Ack)
    reason = end.decision.reason
    assert "held elsewhere" in reason and "another consumer" in reason, reason
    assert "another copy of this message (same message id)" in reason, reason
    assert "this consumer" not in reason


@pytest.mark.parametrize("by_key", [False, True], ids=["message-id", "business-key"])
def test_a_busy_key_this_consumer_holds_for_another_copy_says_so(by_key: bool) -> None:
    ctx = _context(key=(lambda value: value["id"]) if by_key else None)
    first = delivery_flow(_delivery(), ctx)
    claim = advance(first, None)
    assert isinstance(claim, Claim)
    assert isinstance(advance(first, ClaimStatus.CLAIMED), RunHandler)  # handling it now
    copy = _delivery(message_id="m-2" if by_key else "m-1")  # another id, the same body key
    _, end = _walk(ctx, copy, _answers(claim=ClaimStatus.BUSY))
    assert isinstance(end, Ack) and end.decision.action is Action.RETRY
    reason = end.decision.reason
    assert "being handled by this consumer right now" in reason, reason
    what = "another message with the same business key" if by_key else "another copy"
    assert what in reason, reason
    assert isinstance(advance(first, HandlerEnded()), Complete)
    assert isinstance(advance(first, None), Ack)
    # the claim is given up: a copy now finds the key held elsewhere (or done)
    _, later = _walk(ctx, _delivery(), _answers(claim=ClaimStatus.BUSY))
    assert isinstance(later, Ack) and "held elsewhere" in later.decision.reason


@pytest.mark.parametrize("ending", ["failed", "abandoned"])
def test_a_claim_this_consumer_gave_back_is_no_longer_its_own(ending: str) -> None:
    ctx = _context()
    first = delivery_flow(_delivery(), ctx)
    advance(first, None)
    advance(first, ClaimStatus.CLAIMED)
    if ending == "failed":
        assert isinstance(advance(first, HandlerEnded(RuntimeError("boom"))), Release)
        advance(first, None)
    else:
        first.close()  # the consumer stopped with the handler running
    _, end = _walk(ctx, _delivery(), _answers(claim=ClaimStatus.BUSY))
    assert isinstance(end, Ack) and "held elsewhere" in end.decision.reason


def test_a_store_down_at_the_claim_puts_the_delivery_back() -> None:
    steps, end = _walk(_context(), _delivery(), _answers(claim=StoreError("db down")))
    assert _kinds(steps) == ["Claim"]
    assert isinstance(end, PutBack) and "claiming its key failed: db down" in end.why


def test_a_failed_handler_releases_its_claim_then_is_retried() -> None:
    error = RuntimeError("boom")
    steps, end = _walk(_context(), _delivery(), _answers(handler=error))
    assert _kinds(steps) == ["Claim", "RunHandler", "Release", "Publish"]
    release = steps[2]
    assert isinstance(release, Release) and release.key == "q:work:m-1"
    publish = steps[3]
    assert isinstance(publish, Publish) and publish.message.routing_key == "work"
    assert isinstance(end, Ack) and end.decision.action is Action.RETRY
    assert end.handler_ms == 12.5


def test_a_release_that_fails_still_settles_the_delivery() -> None:
    answers = _answers(handler=RuntimeError("boom"), release=StoreError("db down"))
    steps, end = _walk(_context(), _delivery(), answers)
    assert _kinds(steps) == ["Claim", "RunHandler", "Release", "Publish"]
    assert isinstance(end, Ack) and end.decision.action is Action.RETRY


def test_a_timeout_is_a_failure_like_any_other() -> None:
    answers = _answers(handler=HandlerTimeout("ran longer than 1 s"))
    steps, end = _walk(_context(), _delivery(), answers)
    assert _kinds(steps) == ["Claim", "RunHandler", "Release", "Publish"]
    assert isinstance(end, Ack) and end.decision.action is Action.RETRY


def test_non_retryable_goes_to_the_dlq() -> None:
    steps, end = _walk(_context(), _delivery(), _answers(handler=Reject("never")))
    assert _kinds(steps) == ["Claim", "RunHandler", "Release", "Publish"]
    publish = steps[3]
    assert isinstance(publish, Publish)
    assert publish.message.headers[H_DEAD_LETTER_REASON] == "non-retryable"
    assert isinstance(end, Ack) and end.decision.action is Action.DEAD_LETTER


def test_the_last_attempt_goes_to_the_dlq() -> None:
    delivery = _delivery(headers={"delayq-attempt": 3})
    steps, end = _walk(_context(), delivery, _answers(handler=RuntimeError("boom")))
    publish = steps[-1]
    assert isinstance(publish, Publish)
    assert publish.message.headers[H_DEAD_LETTER_REASON] == "exhausted"
    assert isinstance(end, Ack) and end.decision.action is Action.DEAD_LETTER


def test_a_refused_republish_puts_the_delivery_back() -> None:
    answers = _answers(handler=RuntimeError("boom"), publish=PublishError("nacked"))
    steps, end = _walk(_context(), _delivery(), answers)
    assert _kinds(steps) == ["Claim", "RunHandler", "Release", "Publish"]
    assert isinstance(end, PutBack) and "its republish was not confirmed: nacked" in end.why


def test_a_store_down_at_complete_puts_the_delivery_back() -> None:
    steps, end = _walk(_context(), _delivery(), _answers(complete=StoreError("db down")))
    assert _kinds(steps) == ["Claim", "RunHandler", "Complete"]
    assert isinstance(end, PutBack) and "recording its key as done failed" in end.why


def test_transactional_success_does_not_complete_separately() -> None:
    steps, end = _walk(_context(transactional=True), _delivery(), _answers())
    assert _kinds(steps) == ["Claim", "RunHandler"]
    assert isinstance(end, Ack) and end.decision.action is Action.ACK


def test_transactional_failure_releases_and_retries() -> None:
    ctx = _context(transactional=True)
    steps, end = _walk(ctx, _delivery(), _answers(handler=RuntimeError("rolled back")))
    assert _kinds(steps) == ["Claim", "RunHandler", "Release", "Publish"]
    assert isinstance(end, Ack) and end.decision.action is Action.RETRY


@pytest.mark.parametrize(
    "error", [asyncio.CancelledError(), SystemExit(3), KeyboardInterrupt()], ids=type
)
def test_cancelled_or_exiting_handler_gives_the_claim_back_and_gives_up(
    error: BaseException,
) -> None:
    steps, end = _walk(_context(), _delivery(), _answers(handler=error))
    assert _kinds(steps) == ["Claim", "RunHandler", "Release"]
    assert isinstance(end, GiveUp) and end.error is error


def test_an_unclaimed_cancelled_handler_gives_up_at_once() -> None:
    steps, end = _walk(_context(store=False), _delivery(), _answers(handler=SystemExit(1)))
    assert _kinds(steps) == ["RunHandler"]
    assert isinstance(end, GiveUp)


def test_text_and_bytes_bodies_reach_the_handler_decoded() -> None:
    steps, _ = _walk(_context(), _delivery(b"hi", content_type="text/plain"), _answers())
    run = steps[1]
    assert isinstance(run, RunHandler) and run.value == "hi"
    raw = _delivery(json.dumps([1]).encode(), content_type="application/octet-stream")
    steps, _ = _walk(_context(), raw, _answers())
    run = steps[1]
    assert isinstance(run, RunHandler) and run.value == b"[1]"
