"""A browse (and a replay that leaves messages parked) returns what it took and waits
until the broker counts it ready again.

A ``basic.nack`` has no reply, and a quorum queue applies a return once its log has it:
session 11's CI on RabbitMQ 4.0.5 saw a replay started right after a browse find the DLQ
empty ("replayed 0"). The broker's lag cannot be produced on demand, so this channel
lags on purpose: its ready count shows the returns only after a few more reads.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from delayq.sync import parking


class LaggingChannel:
    """A queue of ``parked`` messages whose returns show up ``lag`` count reads late."""

    def __init__(self, parked: int, others: int = 0, lag: int = 3) -> None:
        self.ready = [f"m{i}" for i in range(parked)]
        self.others = others  # ready messages a browse does not take (past its limit)
        self.held: list[str] = []
        self.pending: list[str] = []  # returned, not yet counted
        self.lag = lag
        self.reads_after_return = 0
        self.is_open = True

    def basic_get(self, queue: str, auto_ack: bool) -> tuple[Any, Any, bytes]:
        if not self.ready:
            return None, None, b""
        message_id = self.ready.pop(0)
        self.held.append(message_id)
        method = SimpleNamespace(delivery_tag=len(self.held), routing_key="k")
        return (
            method,
            SimpleNamespace(message_id=message_id, headers={}, content_type=None, timestamp=None),
            b"{}",
        )

    def basic_nack(self, delivery_tag: int, multiple: bool, requeue: bool) -> None:
        assert (delivery_tag, multiple, requeue) == (0, True, True)
        self.pending, self.held = self.held, []

    def queue_declare(self, queue: str, passive: bool) -> Any:
        if self.pending:
            self.reads_after_return += 1
            if self.reads_after_return > self.lag:
                self.ready, self.pending = self.pending + self.ready, []
        count = len(self.ready) + self.others
        return SimpleNamespace(method=SimpleNamespace(message_count=count))

    def counted(self) -> int:
        return len(self.ready) + self.others


@pytest.fixture
def channel(monkeypatch: pytest.MonkeyPatch) -> LaggingChannel:
    lagging = LaggingChannel(parked=3, others=0)
    monkeypatch.setattr(
        parking, "_open", lambda url, queue, returns=True: (lagging, lagging, 3, None)
    )
    return lagging


def test_a_browse_ends_once_the_broker_counts_what_it_returned(channel: LaggingChannel) -> None:
    found = parking.browse("amqp://x/", "ns.work.dlq")
    assert [p.message_id for p in found] == ["m0", "m1", "m2"]
    assert channel.counted() == 3  # what runs next finds all three


def test_a_browse_past_its_limit_waits_for_its_own_returns_not_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lagging = LaggingChannel(parked=5, others=0)
    monkeypatch.setattr(
        parking, "_open", lambda url, queue, returns=True: (lagging, lagging, 5, None)
    )
    found = parking.browse("amqp://x/", "ns.work.dlq", limit=2)
    assert len(found) == 2
    assert lagging.counted() == 5  # the 3 never taken and the 2 returned


def test_a_count_that_never_catches_up_ends_the_wait_without_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lagging = LaggingChannel(parked=2, lag=10**9)  # e.g. another consumer took them
    monkeypatch.setattr(
        parking, "_open", lambda url, queue, returns=True: (lagging, lagging, 2, None)
    )
    monkeypatch.setattr(parking, "GIVE_BACK_WAIT_S", 0.05)
    assert len(parking.browse("amqp://x/", "ns.work.dlq")) == 2
    assert lagging.reads_after_return > 1  # it waited, then gave up quietly
