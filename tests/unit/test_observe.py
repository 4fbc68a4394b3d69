from __future__ import annotations

import logging

import pytest

from delayq.consume.delivery import Action, Decision, Delivery
from delayq.errors import InvalidInput
from delayq.message.envelope import H_DELAY_MS, H_PUBLISHED_AT, H_TIER, H_TIER_MS
from delayq.observe.deliveries import Observers, Settled


def delivery(**headers: object) -> Delivery:
    return Delivery("q", b"{}", "rk", "m1", "application/json", headers)


def test_timing_fields_come_from_the_envelope_headers() -> None:
    d = delivery(**{H_DELAY_MS: 1500, H_TIER: b"5s", H_TIER_MS: 5000, H_PUBLISHED_AT: 10_000})
    event = Settled(
        d, Decision(Action.ACK), received_at_ms=15_200, settled_at_ms=15_300, handler_ms=3.0
    )
    assert event.tier == "5s" and event.tier_ms == 5000
    assert event.due_at_ms == 11_500
    assert event.lateness_ms == 3_700
    assert event.retry_delay_ms is None and event.outcome == "ack"


def test_missing_or_malformed_headers_give_none_not_an_error() -> None:
    event = Settled(
        delivery(**{H_DELAY_MS: "soon", H_PUBLISHED_AT: True}), Decision(Action.ACK), 1, 2, None
    )
    assert (event.requested_delay_ms, event.published_at_ms, event.due_at_ms) == (None,) * 3
    assert event.lateness_ms is None and event.tier is None


def test_a_failing_observer_is_logged_once_and_the_others_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[str | None] = []

    class Bad:
        def settled(self, event: Settled) -> None:
            raise RuntimeError("bug")

    class Good:
        def settled(self, event: Settled) -> None:
            seen.append(event.message_id)

    observers = Observers([Bad(), Good()])
    with caplog.at_level(logging.ERROR, logger="delayq.consumer"):
        for _ in range(3):
            observers.emit(
                delivery(), Decision(Action.ACK), received_at_ms=1, settled_at_ms=2, handler_ms=None
            )
    assert seen == ["m1"] * 3
    assert sum("observer" in r.getMessage() for r in caplog.records) == 1


def test_an_object_without_settled_is_refused() -> None:
    with pytest.raises(InvalidInput, match="settled"):
        Observers([object()])  # type: ignore[list-item]
