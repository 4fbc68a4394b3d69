"""AsyncConsumer against a real broker: retries on schedule, DLQ with reasons, dedup."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from delayq import FixedBackoff, Message, ScheduleBackoff, Topology
from delayq.aio import AsyncConsumer, AsyncPublisher
from delayq.delivery import H_DEAD_LETTER_REASON, H_ERROR_MESSAGE, H_ERROR_TYPE, Reject
from delayq.envelope import H_ATTEMPT
from delayq.idempotency import SQLiteStore
from delayq.sync import apply_topology


class Calls:
    """What a handler saw, and when."""

    def __init__(self) -> None:
        self.values: list[Any] = []
        self.times: list[float] = []

    def record(self, value: Any) -> None:
        self.values.append(value)
        self.times.append(time.monotonic())


async def _until(predicate: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_a_failing_handler_is_retried_on_schedule_then_dead_lettered(
    make_topology, rabbitmq_url, collect
):
    topo: Topology = make_topology(["1s", "2s"])
    queue = f"{topo.namespace}.work"
    calls = Calls()

    async def handler(value: Any) -> None:
        calls.record(value)
        raise ValueError(f"boom {len(calls.values)}")

    async def scenario() -> AsyncConsumer:
        consumer = AsyncConsumer(
            rabbitmq_url, topo, queue, handler, policy=ScheduleBackoff.of(["1s", "2s"])
        )
        await consumer.start()
        async with AsyncPublisher(rabbitmq_url, topo) as pub:
            await pub.publish({"order": 1}, "job.fail", "0s", message_id="always-fails")
        await _until(lambda: consumer.stats.dead_lettered == 1, 10)
        await consumer.stop()
        return consumer

    apply_topology(topo, rabbitmq_url)
    dlq = collect(f"{queue}.dlq")
    consumer = _run(scenario())
    assert calls.values == [{"order": 1}] * 3
    first, second, third = calls.times
    assert 1.0 <= second - first <= 2.0, second - first
    assert 2.0 <= third - second <= 3.0, third - second
    [dead] = dlq.wait(1, timeout_s=5)
    assert dead.message_id == "always-fails"
    assert dead.headers[H_ATTEMPT] == 3
    assert dead.headers[H_DEAD_LETTER_REASON] in ("exhausted", b"exhausted")
    assert b"ValueError" in _bytes(dead.headers[H_ERROR_TYPE])
    assert _bytes(dead.headers[H_ERROR_MESSAGE]) == b"boom 3"
    assert (consumer.stats.retried, consumer.stats.dead_lettered) == (2, 1)


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def test_non_retryable_and_undecodable_go_straight_to_the_dlq_and_the_consumer_goes_on(
    make_topology, rabbitmq_url, collect
):
    topo: Topology = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    calls = Calls()

    async def handler(value: Any) -> None:
        calls.record(value)
        if value.get("poison"):
            raise Reject("this order can never be processed")

    async def scenario() -> AsyncConsumer:
        consumer = AsyncConsumer(rabbitmq_url, topo, queue, handler, prefetch=1)
        await consumer.start()
        async with AsyncPublisher(rabbitmq_url, topo) as pub:
            await pub.publish({"poison": True}, "job.a", "0s", message_id="poison")
            # bytes go out as octet-stream; make one that claims to be JSON:
            from delayq.envelope import MessageFactory

            bad = MessageFactory(topo).build(b"{not json", "job.a", "0s", message_id="bad-json")
            object.__setattr__(bad, "content_type", "application/json")
            await pub.send(bad)
            await pub.publish({"ok": True}, "job.a", "0s", message_id="fine")
        await _until(lambda: consumer.stats.handled >= 2 and consumer.stats.dead_lettered >= 2, 10)
        await consumer.stop()
        return consumer

    apply_topology(topo, rabbitmq_url)
    dlq = collect(f"{queue}.dlq")
    consumer = _run(scenario())
    dead = {a.message_id: a for a in dlq.wait(2, timeout_s=5)}
    assert set(dead) == {"poison", "bad-json"}
    assert _bytes(dead["poison"].headers[H_DEAD_LETTER_REASON]) == b"non-retryable"
    assert _bytes(dead["bad-json"].headers[H_DEAD_LETTER_REASON]) == b"undecodable"
    assert {"ok": True} in calls.values  # the consumer went on
    assert consumer.stats.retried == 0


def test_two_queues_on_one_key_a_retry_reaches_only_the_failing_one(make_topology, rabbitmq_url):
    base = make_topology(["1s"])
    ns = base.namespace
    topo = Topology.from_mapping(
        {
            "namespace": ns,
            "ladder": ["1s"],
            "destinations": [
                {"queue": f"{ns}.work", "bindings": ["order.created"]},
                {"queue": f"{ns}.audit", "bindings": ["order.created", "#"]},
            ],
        }
    )
    failing, audit = Calls(), Calls()

    async def fail(value: Any) -> None:
        failing.record(value)
        raise RuntimeError("downstream is down")

    async def record(value: Any) -> None:
        audit.record(value)

    async def scenario() -> None:
        policy = FixedBackoff(delay="1s", max_attempts=4)
        a = AsyncConsumer(rabbitmq_url, topo, f"{ns}.work", fail, policy=policy)
        b = AsyncConsumer(rabbitmq_url, topo, f"{ns}.audit", record)
        await a.start()
        await b.start()
        async with AsyncPublisher(rabbitmq_url, topo) as pub:
            await pub.publish({"order": 9}, "order.created", "0s")
        await _until(lambda: a.stats.dead_lettered == 1, 10)
        await asyncio.sleep(1.0)
        await a.stop()
        await b.stop()

    try:
        _run(scenario())
    finally:
        from delayq.sync import delete_topology

        delete_topology(topo, rabbitmq_url)
    assert len(failing.values) == 4
    assert audit.values == [{"order": 9}], "the other queue saw a retry"


@pytest.mark.parametrize("same", ["message-id", "business-key"])
def test_duplicates_run_the_side_effect_once(make_topology, rabbitmq_url, tmp_path, same):
    topo: Topology = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    effects = Calls()

    async def handler(value: Any) -> None:
        effects.record(value)

    async def scenario() -> AsyncConsumer:
        store = SQLiteStore(tmp_path / "keys.db")
        consumer = AsyncConsumer(
            rabbitmq_url,
            topo,
            queue,
            handler,
            store=store,
            key=(lambda v: v["order"]) if same == "business-key" else None,
        )
        await consumer.start()
        async with AsyncPublisher(rabbitmq_url, topo) as pub:
            if same == "message-id":
                batch = [Message({"order": 5}, "job.d", "0s", message_id="dup-1")] * 2
            else:
                batch = [
                    Message({"order": 5}, "job.d", "0s", message_id=f"id-{n}") for n in range(2)
                ]
            batch.append(Message({"order": 6}, "job.d", "0s", message_id="other"))
            await pub.publish_many(batch)
        await _until(lambda: consumer.stats.handled + consumer.stats.duplicates >= 3, 10)
        await consumer.stop()
        store.close()
        return consumer

    consumer = _run(scenario())
    assert sorted(v["order"] for v in effects.values) == [5, 6]
    assert consumer.stats.duplicates == 1


def test_a_handler_that_overruns_its_timeout_is_retried_not_stuck(make_topology, rabbitmq_url):
    topo: Topology = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    calls = Calls()

    async def handler(value: Any) -> None:
        calls.record(value)
        if len(calls.values) == 1:
            await asyncio.sleep(30)  # stuck the first time

    async def scenario() -> AsyncConsumer:
        consumer = AsyncConsumer(
            rabbitmq_url,
            topo,
            queue,
            handler,
            handler_timeout="500ms",
            policy=FixedBackoff(delay="1s", max_attempts=3),
        )
        await consumer.start()
        async with AsyncPublisher(rabbitmq_url, topo) as pub:
            await pub.publish({"n": 1}, "job.t", "0s")
        await _until(lambda: consumer.stats.handled == 1, 10)
        await consumer.stop()
        return consumer

    started = time.monotonic()
    consumer = _run(scenario())
    assert len(calls.values) == 2 and consumer.stats.retried == 1
    assert time.monotonic() - started < 10


def test_graceful_stop_finishes_in_flight_handlers_and_loses_nothing(
    make_topology, rabbitmq_url, collect
):
    topo: Topology = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    done = Calls()

    async def handler(value: Any) -> None:
        await asyncio.sleep(0.3)
        done.record(value["n"])

    async def first_run() -> None:
        consumer = AsyncConsumer(rabbitmq_url, topo, queue, handler, prefetch=5)
        await consumer.start()
        async with AsyncPublisher(rabbitmq_url, topo) as pub:
            await pub.publish_many([Message({"n": n}, "job.g", "0s") for n in range(40)])
        await _until(lambda: len(done.values) >= 3, 10)
        await consumer.stop(timeout_s=5)  # in the middle of the stream

    async def second_run() -> None:
        consumer = AsyncConsumer(rabbitmq_url, topo, queue, handler, prefetch=20)
        await consumer.start()
        await _until(lambda: len(set(done.values)) == 40, 20)
        await consumer.stop()

    _run(first_run())
    handled_first = len(done.values)
    assert 3 <= handled_first < 40
    _run(second_run())
    assert set(done.values) == set(range(40)), "a message was lost in the stop"
