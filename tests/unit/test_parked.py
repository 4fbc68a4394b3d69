"""When a parked message was parked, as ``delayq dlq list`` shows its age."""

from __future__ import annotations

from datetime import datetime, timezone

from delayq.consume.delivery import Delivery
from delayq.ops.parked import ParkedMessage

DEATH = datetime(2026, 12, 6, 4, 50, 2, tzinfo=timezone.utc)


def _parked(headers: dict[str, object], timestamp_s: int | None = None) -> ParkedMessage:
    delivery = Delivery("q.dlq", b"{}", "q.dlq", "m", "application/json", headers)
    return ParkedMessage(delivery, timestamp_s, "q")


def test_a_message_the_broker_dead_lettered_was_parked_when_its_x_death_says() -> None:
    """Not when its publisher stamped it (a plugin-style publisher's timestamp, days
    before), and not unknown when it has none."""
    x_death = [{"count": 1, "reason": "rejected", "queue": "q", "time": DEATH}]
    ms = int(DEATH.timestamp() * 1000)
    assert _parked({"x-death": x_death}, timestamp_s=1_700_000_000).parked_at_ms() == ms
    assert _parked({"x-death": x_death}).parked_at_ms() == ms


def test_a_message_delayq_parked_was_parked_when_delayq_says() -> None:
    x_death = [{"count": 1, "reason": "expired", "queue": "t", "time": DEATH}]
    assert _parked({"delayq-failed-at": 5, "x-death": x_death}).parked_at_ms() == 5
    assert _parked({}, timestamp_s=7).parked_at_ms() == 7000
