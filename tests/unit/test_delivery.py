"""The pure consume decisions: retry through the retry tiers, dead-letter with a reason."""

from __future__ import annotations

import random

import pytest
from pydantic import BaseModel

from delayq import ExponentialBackoff, FixedBackoff, Topology
from delayq.consume.delivery import (
    H_DEAD_LETTER_REASON,
    H_ERROR_MESSAGE,
    H_ERROR_TRACE,
    H_ERROR_TYPE,
    H_FIRST_FAILURE_AT,
    Action,
    Delivery,
    Reject,
    Retry,
    Undecodable,
    bounded,
    decode_body,
)
from delayq.consume.planner import MAX_ERROR_MESSAGE_BYTES, MAX_ERROR_TRACE_BYTES, DeliveryPlanner
from delayq.consume.settings import ConsumeSettings
from delayq.message.envelope import H_ATTEMPT, H_DELAY_MS, H_ROUTING_KEY, H_TIER

TOPO = Topology.from_mapping(
    {
        "namespace": "ns",
        "ladder": ["1s", "5s", "1m"],
        "destinations": [{"queue": "work", "bindings": ["job.#"]}],
    }
)


def delivery(attempt: int | None = None, **overrides: object) -> Delivery:
    headers: dict[str, object] = {"tenant": "acme", "x-death": [{"count": 1}]}
    if attempt is not None:
        headers[H_ATTEMPT] = attempt
        headers[H_ROUTING_KEY] = "job.original"
        headers[H_FIRST_FAILURE_AT] = 111
    fields: dict[str, object] = {
        "queue": "work",
        "body": b'{"n": 1}',
        "routing_key": "job.original" if attempt is None else "work",
        "message_id": "m-1",
        "content_type": "application/json",
        "headers": headers,
    }
    fields.update(overrides)
    return Delivery(**fields)  # type: ignore[arg-type]


def planner(**kwargs: object) -> DeliveryPlanner:
    kwargs.setdefault("policy", FixedBackoff(delay="3s", max_attempts=3))
    return DeliveryPlanner(TOPO, "work", clock_ms=lambda: 1_000_000, **kwargs)  # type: ignore[arg-type]


def test_a_failure_is_retried_through_the_retry_tier_to_this_queue_alone():
    decision = planner().failure(delivery(), ValueError("boom"))
    assert decision.action is Action.RETRY
    msg = decision.message
    assert msg is not None
    assert (msg.exchange, msg.routing_key) == ("ns.retry.5s.direct", "work")
    assert msg.message_id == "m-1" and msg.body == b'{"n": 1}'
    assert msg.headers[H_ATTEMPT] == 2
    assert msg.headers[H_DELAY_MS] == 3000 and msg.headers[H_TIER] == "5s"
    assert msg.headers[H_ROUTING_KEY] == "job.original"
    assert msg.headers[H_ERROR_TYPE] == "builtins.ValueError"
    assert msg.headers[H_ERROR_MESSAGE] == "boom"
    assert msg.headers[H_FIRST_FAILURE_AT] == 1_000_000
    assert msg.headers["tenant"] == "acme"
    assert "x-death" not in msg.headers  # replaced on every hop, never stacked


def test_headers_are_replaced_not_stacked_on_later_hops():
    decision = planner().failure(delivery(attempt=2), ValueError("again"))
    msg = decision.message
    assert msg is not None and msg.headers[H_ATTEMPT] == 3
    assert msg.headers[H_ROUTING_KEY] == "job.original"  # not "work"
    assert msg.headers[H_FIRST_FAILURE_AT] == 111  # the first failure is kept


def test_exhausted_attempts_go_to_the_dlq_with_the_reason():
    decision = planner().failure(delivery(attempt=3), ValueError("still"))
    assert decision.action is Action.DEAD_LETTER
    msg = decision.message
    # Through the namespace's direct exchange, never the default one (see delayq.ops.grant).
    assert msg is not None and (msg.exchange, msg.routing_key) == ("ns.direct", "work.dlq")
    assert msg.headers[H_DEAD_LETTER_REASON] == "exhausted"
    assert msg.headers[H_ATTEMPT] == 3 and msg.headers[H_ERROR_MESSAGE] == "still"


class Fatal(Exception):
    pass


@pytest.mark.parametrize("error", [Reject("never"), Fatal("bad data")])
def test_non_retryable_errors_go_straight_to_the_dlq(error):
    decision = planner(non_retryable=(Fatal,)).failure(delivery(), error)
    assert decision.action is Action.DEAD_LETTER
    assert decision.message is not None
    assert decision.message.headers[H_DEAD_LETTER_REASON] == "non-retryable"


def test_a_handler_can_ask_for_its_own_delay():
    decision = planner().failure(delivery(), Retry("50s"))
    assert decision.message is not None and decision.message.exchange == "ns.retry.1m.direct"
    assert decision.delay is not None and decision.delay.total_seconds() == 50


def test_a_retry_longer_than_the_ladder_is_dead_lettered_not_lost():
    decision = planner().failure(delivery(), Retry("2h"))
    assert decision.action is Action.DEAD_LETTER
    assert decision.message is not None
    assert decision.message.headers[H_DEAD_LETTER_REASON] == "delay-too-long"


def test_zero_delay_retries_straight_back_to_the_queue():
    decision = planner().failure(delivery(), Retry("0s"))
    assert decision.message is not None
    assert (decision.message.exchange, decision.message.routing_key) == ("ns.direct", "work")


def test_undecodable_goes_to_the_dlq_with_the_reason():
    bad = delivery(body=b"{not json")
    with pytest.raises(Undecodable) as caught:
        decode_body(bad)
    decision = planner().undecodable(bad, caught.value)
    assert decision.message is not None
    assert decision.message.headers[H_DEAD_LETTER_REASON] == "undecodable"
    assert "cannot decode" in decision.message.headers[H_ERROR_MESSAGE]


def test_error_message_and_trace_are_bounded():
    error = ValueError("é" * 5000)
    decision = planner().failure(delivery(), error, trace="line\n" * 10_000)
    assert decision.message is not None
    headers = decision.message.headers
    assert len(headers[H_ERROR_MESSAGE].encode()) <= MAX_ERROR_MESSAGE_BYTES
    assert len(headers[H_ERROR_TRACE].encode()) <= MAX_ERROR_TRACE_BYTES


def test_bounded_never_cuts_inside_a_character():
    text = bounded("€" * 100, 50)
    assert len(text.encode()) <= 50
    text.encode("utf-8")


class Order(BaseModel):
    n: int


@pytest.mark.parametrize(
    ("content_type", "body", "model", "expected"),
    [
        ("application/json", b'{"n": 1}', None, {"n": 1}),
        ("application/json", b'{"n": 1}', Order, Order(n=1)),
        ("text/plain; charset=utf-8", b"hi", None, "hi"),
        ("application/octet-stream", b"\x00\x01", None, b"\x00\x01"),
        (None, b"raw", None, b"raw"),
    ],
)
def test_decode_body_by_content_type(content_type, body, model, expected):
    assert decode_body(delivery(content_type=content_type, body=body), model) == expected


@pytest.mark.parametrize(
    ("content_type", "body", "model"),
    [
        ("application/json", b"{", None),
        ("application/json", b'{"n": "x"}', Order),
        ("text/plain", b"\xff\xfe", None),
    ],
)
def test_undecodable_bodies(content_type, body, model):
    with pytest.raises(Undecodable):
        decode_body(delivery(content_type=content_type, body=body), model)


def test_jitter_uses_the_injected_random_source():
    policy = ExponentialBackoff(initial="10s", max_delay="1m", jitter=0.5, max_attempts=5)
    one = planner(policy=policy, rng=random.Random(3)).failure(delivery(), ValueError())
    two = planner(policy=policy, rng=random.Random(3)).failure(delivery(), ValueError())
    assert one.message is not None and two.message is not None
    assert one.message.headers[H_DELAY_MS] == two.message.headers[H_DELAY_MS] <= 10_000


@pytest.mark.parametrize("value", ["2", -1, 0, True, None, 1.5])
def test_malformed_attempt_headers_count_as_the_first(value):
    assert Delivery("q", b"", "k", "m", None, {H_ATTEMPT: value}).attempt == 1


def test_a_busy_key_is_deferred_to_the_smallest_tier_without_counting_an_attempt():
    decision = planner().deferred(delivery(attempt=2))
    assert decision.action is Action.RETRY and decision.message is not None
    assert decision.message.exchange == "ns.retry.1s.direct"
    assert decision.message.headers[H_ATTEMPT] == 2
    assert decision.message.headers[H_FIRST_FAILURE_AT] == 111


@pytest.mark.parametrize(
    ("here", "by_key", "says"),
    [
        (True, False, "another copy of this message (same message id) is being handled by "
         "this consumer right now"),
        (True, True, "another message with the same business key is being handled by this "
         "consumer right now"),
        (False, False, "held elsewhere: another consumer is handling another copy of this "
         "message (same message id)"),
        (False, True, "held elsewhere: another consumer is handling another message with "
         "the same business key"),
    ],
)  # fmt: skip
def test_a_deferral_says_whose_claim_holds_the_key(here, by_key, says):
    """Issue 29: it said "claimed by another consumer" also when this consumer held it."""
    reason = planner().deferred(delivery(), here=here, by_key=by_key).reason
    assert says in reason, reason


@pytest.mark.parametrize(
    "kwargs",
    [
        {"prefetch": 0, "handler_timeout": "1s"},
        {"prefetch": True, "handler_timeout": "1s"},
        {"prefetch": 10, "handler_timeout": 5},
        {"prefetch": 10, "handler_timeout": "0s"},
        {"prefetch": 10, "handler_timeout": "1m", "lease": "30s"},
    ],
)
def test_consumer_settings_refuse_bad_values(kwargs):
    with pytest.raises(ValueError):
        ConsumeSettings.parse(**kwargs)


def test_consumer_settings_lease_outlives_the_timeout_by_default():
    settings = ConsumeSettings.parse(prefetch=10, handler_timeout="2m")
    assert (settings.handler_timeout_ms, settings.lease_ms) == (120_000, 180_000)


def test_a_planner_for_a_queue_outside_the_topology_is_refused():
    with pytest.raises(ValueError, match="not a destination"):
        DeliveryPlanner(TOPO, "elsewhere")


def test_retention_must_outlive_the_lease_and_sets_the_prune_interval():
    with pytest.raises(ValueError, match="retention"):
        ConsumeSettings.parse(prefetch=1, handler_timeout="1m", retention="1m")
    week = ConsumeSettings.parse(prefetch=1, handler_timeout="1m")
    assert (week.retention_ms, week.prune_every_ms) == (7 * 86_400_000, 600_000)
    short = ConsumeSettings.parse(prefetch=1, handler_timeout="500ms", lease="1s", retention="2s")
    assert short.prune_every_ms == 1_000


def test_a_replayed_message_keeps_its_replay_history_on_retries_and_dead_letters():
    """The history a replay writes travels on through an untraced consumer's retries and
    dead letters, so a second replay counts on from it."""
    from delayq.consume.delivery import H_PREVIOUS_ATTEMPTS, H_REPLAYS

    history = {H_REPLAYS: 1, H_PREVIOUS_ATTEMPTS: 3}
    replayed = delivery(attempt=1)
    replayed.headers.update(history)
    retried = planner().failure(replayed, ValueError("again")).message
    assert retried is not None
    assert {k: retried.headers[k] for k in history} == history
    last = delivery(attempt=3)
    last.headers.update(history)
    dead = planner().failure(last, ValueError("still")).message
    assert dead is not None and dead.routing_key == "work.dlq"
    assert {k: dead.headers[k] for k in history} == history


def test_a_handler_timeout_while_every_thread_is_stuck_dead_letters_with_its_reason():
    from delayq.errors import HandlersStuck

    decision = planner().failure(delivery(attempt=2), HandlersStuck("not run: stuck"))
    assert decision.action is Action.DEAD_LETTER
    assert decision.message is not None
    assert decision.message.headers[H_DEAD_LETTER_REASON] == "handlers-stuck"
    assert decision.reason.startswith("handlers-stuck: not run: stuck")
