"""Cancel and reschedule (issue 15): the same scenarios on the memory broker and RabbitMQ.

A publisher given the consumers' store cancels or reschedules; the consumers meet the
marks when a copy arrives. Each scenario runs with sync and async publishers and
consumers, on virtual time and on a real broker (ladders of 1-2 s). See
``docs/concepts/cancel.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from delayq import CancelStatus, Reschedule, Topology
from delayq.consume.retry import FixedBackoff
from delayq.stores.memory import InMemoryStore

from .conftest import Bench, BenchPublisher
from .test_contract import Recorder

S = CancelStatus


@dataclass
class Setup:
    """A topology's first queue with a consumer, and a publisher, sharing one store."""

    queue: str
    store: InMemoryStore
    recorder: Recorder
    consumer: Any
    publisher: BenchPublisher


def _setup(bench: Bench, topology: Topology, fail: Any = None, **options: Any) -> Setup:
    queue = topology.destinations[0].queue
    store, recorder = InMemoryStore(), Recorder(bench, fail=fail)
    consumer = bench.consume(topology, queue, recorder, store=store, **options)
    return Setup(queue, store, recorder, consumer, bench.publisher(topology, store=store))


def _quiet(bench: Bench, consumer: Any, *, cancelled: int, within: str = "15s") -> None:
    """Until ``consumer`` has met ``cancelled`` marks, then a moment more for a stray copy."""
    assert bench.run_until(lambda: consumer.stats.cancelled == cancelled, within=within)
    bench.settle(1.0)


def test_a_message_cancelled_while_parked_is_never_handled(bench: Bench) -> None:
    topology = bench.topology(("1s", "2s"))
    s = _setup(bench, topology)
    queue, recorder, consumer, publisher = s.queue, s.recorder, s.consumer, s.publisher
    publisher.publish({"order": 1}, "job.expire", "2s", message_id="order-1")
    publisher.publish({"order": 2}, "job.expire", "2s", message_id="order-2")

    receipt = publisher.cancel(message_id="order-1")
    assert receipt.queues == {queue: S.UNKNOWN} and receipt.cancelled
    assert bench.run_until(lambda: consumer.stats.handled == 1, within="15s")
    _quiet(bench, consumer, cancelled=1)
    assert recorder.bodies == [{"order": 2}]
    assert consumer.stats.cancelled == 1 and consumer.stats.retried == 0
    assert bench.peek(f"{queue}.dlq") == []
    assert publisher.cancel(message_id="order-1").status is S.ALREADY_CANCELLED


def test_a_cancel_before_the_publish_waits_for_the_message(bench: Bench) -> None:
    topology = bench.topology(("1s", "2s"))
    s = _setup(bench, topology)
    queue, recorder, consumer, publisher = s.queue, s.recorder, s.consumer, s.publisher

    receipt = publisher.cancel(message_id="later-1")
    assert receipt.status is S.UNKNOWN and receipt.cancelled
    publisher.publish("never", "job.run", "1s", message_id="later-1")
    publisher.publish("now", "job.run", "0s", message_id="later-2")
    _quiet(bench, consumer, cancelled=1)
    assert recorder.bodies == ["now"]
    assert bench.peek(f"{queue}.dlq") == []


def test_a_message_cancelled_in_a_retry_tier_is_not_retried(bench: Bench) -> None:
    topology = bench.topology(("1s", "2s"))
    policy = FixedBackoff(delay="2s", max_attempts=3)
    s = _setup(bench, topology, lambda body, n: RuntimeError("first attempt"), policy=policy)
    queue, recorder, consumer, publisher = s.queue, s.recorder, s.consumer, s.publisher
    publisher.publish({"bill": 9}, "job.bill", "0s", message_id="bill-9")

    assert bench.run_until(lambda: consumer.stats.retried == 1, within="10s")
    receipt = publisher.cancel(message_id="bill-9")
    # A failed attempt gives its claim back: the store has no record of the key.
    assert receipt.queues == {queue: S.UNKNOWN} and receipt.cancelled
    _quiet(bench, consumer, cancelled=1)
    assert recorder.bodies == [{"bill": 9}]  # the first attempt only
    assert consumer.stats.retried == 1 and consumer.stats.dead_lettered == 0
    assert bench.peek(f"{queue}.dlq") == []


@pytest.mark.parametrize("how", ["reschedule", "reschedule_many"])
@pytest.mark.parametrize(("old", "new"), [("1s", "2s"), ("2s", "1s")], ids=["later", "earlier"])
def test_a_rescheduled_message_is_handled_once_at_its_new_time(
    bench: Bench, how: str, old: str, new: str
) -> None:
    topology = bench.topology(("1s", "2s"))
    s = _setup(bench, topology)
    queue, recorder, consumer, publisher = s.queue, s.recorder, s.consumer, s.publisher
    first = publisher.publish("old", "job.remind", old, message_id="remind-1")

    if how == "reschedule":
        moved = publisher.reschedule("new", "job.remind", new, message_id="remind-1")
    else:
        (moved,) = publisher.reschedule_many(
            [Reschedule("new", "job.remind", new, message_id="remind-1")]
        )
    assert moved.moved and moved.marks.queues == {queue: S.UNKNOWN}
    sent = moved.receipt
    assert sent is not None and sent.message_id == "remind-1"
    # The older copy arrives too (before or after the new one) and meets its mark.
    assert bench.run_until(lambda: consumer.stats.handled == 1, within="15s")
    _quiet(bench, consumer, cancelled=1)
    assert recorder.bodies == ["new"]  # exactly one copy: the new one, never the old
    [(_, arrived_ms)] = recorder.seen
    assert arrived_ms >= sent.published_at_ms + sent.delay_ms
    assert arrived_ms <= sent.published_at_ms + sent.tier_ms + bench.slack_ms
    if old == "1s":  # later: handled after the old due time, so not at it
        assert arrived_ms >= first.published_at_ms + first.tier_ms
    assert bench.peek(f"{queue}.dlq") == []


def test_reschedule_many_moves_several_messages_in_one_batch(bench: Bench) -> None:
    topology = bench.topology(("1s", "2s"))
    s = _setup(bench, topology)
    queue, recorder, consumer, publisher = s.queue, s.recorder, s.consumer, s.publisher
    for n, delay in enumerate(["1s", "2s", "2s"]):
        publisher.publish(f"old-{n}", "job.remind", delay, message_id=f"r-{n}")
    publisher.cancel(message_id="r-2")

    moved = publisher.reschedule_many(
        [
            Reschedule("new-0", "job.remind", "2s", message_id="r-0"),
            Reschedule("new-1", "job.remind", "1s", message_id="r-1"),
            Reschedule("new-2", "job.remind", "1s", message_id="r-2"),
        ]
    )
    assert [m.moved for m in moved] == [True, True, False]
    assert moved[2].marks.status is S.ALREADY_CANCELLED and moved[2].receipt is None
    assert bench.run_until(lambda: consumer.stats.handled == 2, within="15s")
    _quiet(bench, consumer, cancelled=3)
    assert sorted(recorder.bodies) == ["new-0", "new-1"]
    assert bench.peek(f"{queue}.dlq") == []


def test_a_cancel_after_the_handler_ran_says_already_handled(bench: Bench) -> None:
    topology = bench.topology(("1s",))
    s = _setup(bench, topology)
    queue, recorder, consumer, publisher = s.queue, s.recorder, s.consumer, s.publisher
    publisher.publish("done", "job.run", "0s", message_id="done-1")

    assert bench.run_until(lambda: consumer.stats.handled == 1, within="10s")
    receipt = publisher.cancel(message_id="done-1")
    assert receipt.queues == {queue: S.ALREADY_HANDLED} and not receipt.cancelled
    late = publisher.reschedule("done", "job.run", "1s", message_id="done-1")
    assert not late.moved and late.marks.status is S.ALREADY_HANDLED
    bench.settle(1.5)
    assert recorder.bodies == ["done"] and consumer.stats.cancelled == 0


def test_a_cancel_stops_an_exact_strategy_message_mid_cascade(bench: Bench) -> None:
    topology = bench.topology(("1s", "2s"), strategy="exact", exact={"unit": "250ms"})
    s = _setup(bench, topology)
    queue, recorder, consumer, publisher = s.queue, s.recorder, s.consumer, s.publisher
    sent = publisher.publish("tick", "job.tick", "1750ms", message_id="tick-1")
    kept = publisher.publish("tock", "job.tick", "1250ms", message_id="tick-2")
    assert sent.hops == 3 and kept.hops == 2

    assert publisher.cancel(message_id="tick-1").queues == {queue: S.UNKNOWN}
    _quiet(bench, consumer, cancelled=1)
    assert recorder.bodies == ["tock"]
    [(_, arrived_ms)] = recorder.seen
    assert kept.published_at_ms + 1250 <= arrived_ms <= kept.published_at_ms + 1250 + bench.slack_ms
    assert bench.peek(f"{queue}.dlq") == []


def test_a_cancel_marks_every_queue_a_fanned_out_message_reaches(bench: Bench) -> None:
    topology = bench.topology(
        ("1s", "2s"),
        destinations=[
            {"queue": "billing", "bindings": ["job.*"]},
            {"queue": "audit", "bindings": ["job.#"]},
        ],
    )
    billing_queue, audit_queue = (d.queue for d in topology.destinations)
    store = InMemoryStore()  # one store for both queues, keys in each queue's scope
    billing, audit = Recorder(bench), Recorder(bench)
    billing_consumer = bench.consume(topology, billing_queue, billing, store=store)
    audit_consumer = bench.consume(topology, audit_queue, audit, store=store)
    publisher = bench.publisher(topology, store=store)
    publisher.publish("cancel me", "job.paid", "1s", message_id="fan-1")
    publisher.publish("audit only", "job.paid.late", "1s", message_id="fan-2")

    receipt = publisher.cancel(message_id="fan-1", routing_key="job.paid")
    assert receipt.queues == {billing_queue: S.UNKNOWN, audit_queue: S.UNKNOWN}
    assert receipt.cancelled
    assert bench.run_until(lambda: audit_consumer.stats.handled == 1, within="15s")
    _quiet(bench, billing_consumer, cancelled=1)
    assert audit_consumer.stats.cancelled == 1
    assert billing.bodies == [] and audit.bodies == ["audit only"]
    assert bench.peek(f"{billing_queue}.dlq") == [] and bench.peek(f"{audit_queue}.dlq") == []
