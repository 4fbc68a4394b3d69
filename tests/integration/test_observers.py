"""Observers see every settled delivery, with the timing fields delivery records and
metrics are built from, through both adapters against a real broker."""

from __future__ import annotations

import threading
from typing import Any

from delayq import FixedBackoff, Message, Settled
from delayq.consume.delivery import Action, Reject
from delayq.stores.memory import InMemoryStore
from delayq.sync import apply_topology

from .test_consumer import publish, until


class Recorder:
    def __init__(self) -> None:
        self.events: list[Settled] = []
        self._lock = threading.Lock()

    def settled(self, event: Settled) -> None:
        with self._lock:
            self.events.append(event)

    def of(self, message_id: str) -> list[Settled]:
        with self._lock:
            return [e for e in self.events if e.message_id == message_id]


class Broken:
    calls = 0

    def settled(self, event: Settled) -> None:
        Broken.calls += 1
        raise RuntimeError("observer bug")


def test_observers_see_each_fate_with_its_timing(make_topology, rabbitmq_url, start_consumer):
    topo = make_topology(["1s", "2s"])
    queue = f"{topo.namespace}.work"
    apply_topology(topo, rabbitmq_url)
    recorder = Recorder()
    Broken.calls = 0

    def handler(value: Any) -> None:
        if value == "reject":
            raise Reject("never")
        if value == "flaky" and not recorder.of("flaky"):
            raise ValueError("first time")

    consumer = start_consumer(
        topo,
        queue,
        handler,
        policy=FixedBackoff(delay="1s", max_attempts=3),
        store=InMemoryStore(),
        key=lambda value: str(value),
        observers=[Broken(), recorder],
    )
    publish(
        rabbitmq_url,
        topo,
        Message("ok", "job.a", "1s", message_id="ok"),
        Message("reject", "job.b", "0s", message_id="reject"),
        Message("flaky", "job.c", "0s", message_id="flaky"),
        Message("ok", "job.d", "2s", message_id="dup"),  # same key as "ok": a duplicate
    )
    assert until(lambda: len(recorder.events) == 5, 15), [e.outcome for e in recorder.events]
    assert Broken.calls == 5  # a failing observer neither stops the consumer nor the others

    [ok] = recorder.of("ok")
    assert ok.action is Action.ACK and ok.outcome == "ack"
    assert ok.routing_key == "job.a" and ok.queue == queue and ok.attempt == 1
    assert ok.requested_delay_ms == 1000 and ok.tier == "1s" and ok.tier_ms == 1000
    assert ok.published_at_ms is not None and ok.due_at_ms == ok.published_at_ms + 1000
    assert ok.lateness_ms is not None and 0 <= ok.lateness_ms < 2000
    assert ok.handler_ms is not None and ok.handler_ms >= 0
    assert ok.received_at_ms <= ok.settled_at_ms

    [rejected] = recorder.of("reject")
    assert rejected.action is Action.DEAD_LETTER and "never" in rejected.reason
    assert rejected.tier == "immediate" and rejected.requested_delay_ms == 0

    first, second = recorder.of("flaky")
    assert first.action is Action.RETRY and first.retry_delay_ms == 1000
    assert second.action is Action.ACK and second.attempt == 2
    assert second.routing_key == "job.c"

    [dup] = recorder.of("dup")
    assert dup.action is Action.DUPLICATE and dup.handler_ms is None
    assert (consumer.stats.handled, consumer.stats.duplicates) == (2, 1)
