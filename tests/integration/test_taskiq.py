"""taskiq-aio-pika's delays, and the same through :class:`delayq.integrations.taskiq.DelayqBroker`,
on a real broker. taskiq-aio-pika #25: its delay queue is one FIFO queue whose messages each
carry their own expiration, which the broker applies at the head only, so a long delay
holds every shorter one kicked after it; through delayq's tiers each waits its own."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Callable
from typing import Any

import pika
import pytest
from taskiq import SmartRetryMiddleware
from taskiq.receiver import Receiver
from taskiq_aio_pika import AioPikaBroker, Exchange, Queue, QueueType

from delayq import DelayTooLong, InvalidDelay, InvalidInput, Topology, UnboundRoutingKey
from delayq.integrations.taskiq import DelayqBroker
from tests.waiting import first_message

LONG_S, SHORT_S = 6, 1


def _run(main: Callable[[], Any]) -> Any:
    """``main()`` on the event loop under test (tests/loops.py sets the policy)."""
    return asyncio.run(main())


async def _kick_and_wait(broker: AioPikaBroker, kicks: dict[str, float]) -> dict[str, float]:
    """Kick ``mark(tag)`` with each delay, run a worker until every tag ran; returns the
    seconds from the first kick to each run."""
    ran: dict[str, float] = {}
    done = asyncio.Event()

    @broker.task(task_name=f"mark{uuid.uuid4().hex[:6]}")
    async def mark(tag: str) -> None:
        ran[tag] = time.monotonic()
        if ran.keys() == kicks.keys():
            done.set()

    broker.is_worker_process = True
    await broker.startup()
    stop = asyncio.Event()
    worker = asyncio.create_task(
        Receiver(broker, run_startup=False, max_async_tasks=8).listen(stop)
    )
    try:
        started = time.monotonic()
        for tag, delay in kicks.items():
            await mark.kicker().with_labels(delay=delay).kiq(tag)
        await asyncio.wait_for(done.wait(), 60)
    finally:
        stop.set()
        await asyncio.wait_for(worker, 30)
        await broker.shutdown()
    return {tag: at - started for tag, at in ran.items()}


def test_taskiq_delay_queue_holds_a_short_delay_behind_a_long_one(
    rabbitmq_url: str, names: Callable[[str], str]
) -> None:
    """#25 reproduced: the 1 s task runs when the 6 s one does."""
    exchange, queue, delay_queue, dead = names("x"), names("q"), names("delay"), names("dlq")
    broker = AioPikaBroker(
        rabbitmq_url, exchange=Exchange(name=exchange),
        task_queues=[Queue(name=queue, type=QueueType.CLASSIC)],
        delay_queue=Queue(name=delay_queue, type=QueueType.CLASSIC),
        dead_letter_queue=Queue(name=dead, type=QueueType.CLASSIC),
    )  # fmt: skip
    ran = _run(lambda: _kick_and_wait(broker, {"long": LONG_S, "short": SHORT_S}))
    assert ran["short"] >= LONG_S - 0.5, ran  # held behind the long one


def test_through_delayq_each_delay_waits_its_own_tier(
    rabbitmq_url: str, names: Callable[[str], str], make_topology: Callable[..., Topology]
) -> None:
    exchange, queue, dead = names("x"), names("q"), names("dlq")
    broker = DelayqBroker(
        rabbitmq_url, exchange=Exchange(name=exchange),
        task_queues=[Queue(name=queue)],  # taskiq's default: a quorum queue
        dead_letter_queue=Queue(name=dead),
        topology=make_topology(ladder=[f"{SHORT_S}s", f"{LONG_S}s"], destinations=[]),
    )  # fmt: skip
    ran = _run(lambda: _kick_and_wait(broker, {"long": LONG_S, "short": SHORT_S, "now": 0}))
    assert ran["now"] < SHORT_S, ran
    assert SHORT_S - 0.1 <= ran["short"] < LONG_S - 2, ran  # not behind the long one
    assert ran["long"] >= LONG_S - 0.1, ran


def test_smart_retries_wait_in_the_tiers_and_run_once_more_each(
    rabbitmq_url: str, names: Callable[[str], str], make_topology: Callable[..., Topology]
) -> None:
    exchange, queue, dead = names("x"), names("q"), names("dlq")
    broker = DelayqBroker(
        rabbitmq_url, exchange=Exchange(name=exchange), task_queues=[Queue(name=queue)],
        dead_letter_queue=Queue(name=dead), topology=make_topology(ladder=["1s"], destinations=[]),
    ).with_middlewares(
        SmartRetryMiddleware(default_retry_count=3, default_delay=1, use_jitter=False)
    )  # fmt: skip
    attempts: list[float] = []
    done = asyncio.Event()

    @broker.task(task_name=f"flaky{uuid.uuid4().hex[:6]}", retry_on_error=True)
    async def flaky() -> str:
        attempts.append(time.monotonic())
        if len(attempts) < 3:
            raise RuntimeError("not yet")
        done.set()
        return "ok"

    async def main() -> None:
        broker.is_worker_process = True
        await broker.startup()
        stop = asyncio.Event()
        worker = asyncio.create_task(Receiver(broker, run_startup=False).listen(stop))
        try:
            await flaky.kiq()
            await asyncio.wait_for(done.wait(), 60)
            await asyncio.sleep(0)  # let the worker ack
        finally:
            stop.set()
            await asyncio.wait_for(worker, 30)
            await broker.shutdown()

    _run(main)
    assert len(attempts) == 3
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert all(gap >= 0.9 for gap in gaps), gaps  # each retry waited in the 1 s tier


def test_misuse_is_refused_before_anything_is_sent(
    rabbitmq_url: str, names: Callable[[str], str], make_topology: Callable[..., Topology]
) -> None:
    topology = make_topology(ladder=["1s"], destinations=[])
    with pytest.raises(InvalidInput, match="delay_queue"):
        DelayqBroker(rabbitmq_url, topology=topology, delay_queue=Queue(name=names("d")))
    listed = Topology(namespace="x", destinations=[{"queue": "jobs", "bindings": ["jobs"]}])
    with pytest.raises(InvalidInput, match="existing: true"):
        _ = DelayqBroker(
            rabbitmq_url, task_queues=[Queue(name="jobs")], topology=listed
        ).delayq_topology
    exchange, first, second, dead = names("x"), names("q"), names("q"), names("dlq")
    broker = DelayqBroker(
        rabbitmq_url, exchange=Exchange(name=exchange),
        task_queues=[Queue(name=first), Queue(name=second)],
        dead_letter_queue=Queue(name=dead), topology=topology,
    )  # fmt: skip

    @broker.task(task_name="never")
    async def never() -> None:
        raise AssertionError("ran")

    async def main() -> list[BaseException]:
        await broker.startup()
        caught = []
        kicks = [{"delay": bad, "queue_name": first} for bad in ("soon", -1, "nan", "1e400")]
        kicks += [{"delay": 1}, {"delay": 1, "queue_name": "nowhere"}]
        try:
            for labels in kicks:
                try:
                    await never.kicker().with_labels(**labels).kiq()
                except Exception as exc:  # taskiq wraps ours in its SendTaskError
                    caught.append(exc.__cause__ or exc)
        finally:
            await broker.shutdown()
        return caught

    caught = _run(main)
    expected = [InvalidDelay] * 3 + [DelayTooLong, InvalidInput, UnboundRoutingKey]
    assert [type(e) for e in caught] == expected, caught
    assert "which queue" in str(caught[4])
    channel = pika.BlockingConnection(pika.URLParameters(rabbitmq_url)).channel()
    for queue in (first, second):
        assert channel.queue_declare(queue, passive=True).method.message_count == 0
    tiers = [channel.queue_declare(topology.tier_name(t), passive=True) for t in topology.ladder]
    assert [t.method.message_count for t in tiers] == [0]
    channel.connection.close()


def test_a_delayed_kick_arrives_with_its_priority_and_taskiqs_body(
    rabbitmq_url: str, names: Callable[[str], str], make_topology: Callable[..., Topology]
) -> None:
    exchange, queue, dead = names("x"), names("q"), names("dlq")
    broker = DelayqBroker(
        rabbitmq_url, exchange=Exchange(name=exchange),
        task_queues=[Queue(name=queue, type=QueueType.CLASSIC, max_priority=9)],
        dead_letter_queue=Queue(name=dead, type=QueueType.CLASSIC),
        topology=make_topology(ladder=["1s"], destinations=[]),
    )  # fmt: skip

    @broker.task(task_name="ranked")
    async def ranked() -> None:
        raise AssertionError("no worker here")

    async def main() -> tuple[Any, list[BaseException]]:
        await broker.startup()
        refused = []
        try:
            sent = await ranked.kicker().with_labels(delay=0.2, priority=3).kiq()
            for bad in ("high", 300):
                try:
                    await ranked.kicker().with_labels(delay=0.2, priority=bad).kiq()
                except Exception as exc:
                    refused.append(exc.__cause__ or exc)
        finally:
            await broker.shutdown()
        return sent, refused

    sent, refused = _run(main)
    assert [type(e) for e in refused] == [InvalidInput, InvalidInput], refused
    method, properties, body = first_message(rabbitmq_url, queue)
    assert method is not None, "never arrived"
    assert properties.priority == 3 and properties.delivery_mode == 2
    assert properties.headers["task_id"] == sent.task_id
    assert broker.formatter.loads(body).task_id == sent.task_id  # taskiq's body, unchanged


@pytest.mark.parametrize("default_delay", [60, float("inf")])
def test_a_retry_longer_than_the_ladder_is_dead_lettered_with_its_reason(
    rabbitmq_url: str,
    names: Callable[[str], str],
    make_topology: Callable[..., Topology],
    default_delay: float,
) -> None:
    exchange, queue, dead = names("x"), names("q"), names("dlq")
    broker = DelayqBroker(
        rabbitmq_url, exchange=Exchange(name=exchange), task_queues=[Queue(name=queue)],
        dead_letter_queue=Queue(name=dead), topology=make_topology(ladder=["1s"], destinations=[]),
    ).with_middlewares(
        SmartRetryMiddleware(default_retry_count=3, default_delay=default_delay)
    )  # fmt: skip
    runs: list[float] = []

    @broker.task(task_name=f"fails{uuid.uuid4().hex[:6]}", retry_on_error=True)
    async def fails() -> None:
        runs.append(time.monotonic())
        raise RuntimeError("always")

    async def main() -> Any:
        broker.is_worker_process = True
        await broker.startup()
        stop = asyncio.Event()
        worker = asyncio.create_task(Receiver(broker, run_startup=False).listen(stop))
        try:
            sent = await fails.kiq()
            channel = broker.write_channel
            assert channel is not None
            dead_queue = await channel.get_queue(dead)
            for _ in range(600):
                got = await dead_queue.get(no_ack=True, fail=False)
                if got is not None:
                    return sent, got
                await asyncio.sleep(0.05)
            raise AssertionError("never dead-lettered")
        finally:
            stop.set()
            await asyncio.wait_for(worker, 30)
            await broker.shutdown()

    sent, got = _run(main)
    assert got.headers["task_id"] == sent.task_id and len(runs) == 1
    assert "longer than" in str(got.headers["x-delayq-reason"])
    channel = pika.BlockingConnection(pika.URLParameters(rabbitmq_url)).channel()
    queued = channel.queue_declare(queue, passive=True).method
    assert queued.message_count == 0  # settled, not left unacked to run again
    channel.connection.close()


def test_the_exact_strategy_runs_each_kick_within_a_unit_of_its_delay(
    rabbitmq_url: str, names: Callable[[str], str], make_topology: Callable[..., Topology]
) -> None:
    exchange, queue, dead = names("x"), names("q"), names("dlq")
    topology = make_topology(
        ladder=["1h"], destinations=[], strategy="exact", exact={"unit": "100ms", "levels": 15}
    )
    broker = DelayqBroker(
        rabbitmq_url, exchange=Exchange(name=exchange), task_queues=[Queue(name=queue)],
        dead_letter_queue=Queue(name=dead), topology=topology,
    )  # fmt: skip
    ran = _run(lambda: _kick_and_wait(broker, {"long": 2.2, "short": 0.7}))
    # never early; not in the 1 h tier; the short one not held behind the long one
    assert 0.7 <= ran["short"] < 2.2 <= ran["long"] < 30, ran
