"""Handlers at once, pure parts: the concurrency setting, the handler-thread pool's
bounds, what a handler may be, and the crash count carried across deferrals."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from delayq import Topology, Worker
from delayq.consume.delivery import H_DEAD_LETTER_REASON, H_RETURNS, Action, Delivery, is_fresh
from delayq.consume.handlers import check_handler, plain_result
from delayq.consume.planner import DeliveryPlanner
from delayq.consume.settings import ConsumeSettings
from delayq.errors import InvalidInput
from delayq.sync._threads import HandlerThreads, Job

TOPOLOGY = Topology(
    namespace="cc",
    ladder=["1s", "10s"],
    destinations=[{"queue": "work", "bindings": ["job.#"], "delivery_limit": 3}],
)


@pytest.mark.parametrize("bad", [0, -1, True, False, 1.5, "8", [2]])
def test_concurrency_must_be_a_positive_int(bad: Any) -> None:
    with pytest.raises(InvalidInput, match="concurrency"):
        ConsumeSettings.parse(prefetch=50, handler_timeout="5m", concurrency=bad)


def test_concurrency_above_the_prefetch_is_refused_and_says_what_to_change() -> None:
    with pytest.raises(InvalidInput, match="raise prefetch or lower concurrency"):
        ConsumeSettings.parse(prefetch=10, handler_timeout="5m", concurrency=11)
    settings = ConsumeSettings.parse(prefetch=10, handler_timeout="5m", concurrency=10)
    assert settings.concurrency == 10
    assert ConsumeSettings.parse(prefetch=10, handler_timeout="5m").concurrency is None


def test_the_sync_default_is_eight_threads_or_the_prefetch() -> None:
    from delayq.sync import Consumer

    url = "amqp://guest:guest@127.0.0.1:1/"  # never connected: building checks only
    assert Consumer(url, TOPOLOGY, "work", lambda body: None).concurrency == 8
    assert Consumer(url, TOPOLOGY, "work", lambda body: None, prefetch=3).concurrency == 3
    assert Consumer(url, TOPOLOGY, "work", lambda body: None, concurrency=2).concurrency == 2


def test_worker_passes_concurrency_to_plain_and_coroutine_handlers() -> None:
    worker = Worker(TOPOLOGY)

    @worker.handler("work")
    def plain(body: Any) -> None: ...

    reg = worker.registrations[0]
    assert worker.consumer_options(reg, concurrency=3)["concurrency"] == 3


def _job(call: Any, n: int = 0) -> Job:
    delivery = Delivery(
        queue="work",
        body=b"",
        routing_key="job.x",
        message_id=f"m{n}",
        content_type=None,
        headers={},
    )
    return Job(None, delivery, 0, None, call)


def _overrun(pool: HandlerThreads, count: int) -> list[Job]:
    """Wait (with a deadline) until ``count`` jobs are past their timeout; abandon them."""
    late: list[Job] = []
    deadline = time.monotonic() + 5
    while len(late) < count and time.monotonic() < deadline:
        late += pool.overrun()
        time.sleep(0.01)
    return late


def test_handler_threads_keep_their_slots_and_stay_bounded() -> None:
    """Two slots and two spare threads: overrunning handlers give their slot back, and
    once four threads are stuck no more start, until one of them ends."""
    release = threading.Event()
    pool = HandlerThreads(2, spare=2, timeout_s=0.05, name="t-handler")
    try:
        for n in range(2):
            pool.submit(_job(lambda: release.wait(10), n))
        assert pool.free() == 0
        assert len(_overrun(pool, 2)) == 2
        assert pool.running == 0 and pool.abandoned == 2
        assert pool.free() == 2  # the slots are usable again
        for n in range(2, 4):
            pool.submit(_job(lambda: release.wait(10), n))
        assert len(_overrun(pool, 2)) == 2
        assert pool.abandoned == 4 and pool.free() == 0, "the bound: 2 working + 2 spare"
        assert pool.threads == 4
        release.set()  # the stuck handlers end: their outcomes are dropped
        deadline = time.monotonic() + 5
        while pool.abandoned and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pool.abandoned == 0 and pool.free() == 2
        assert pool.finished.empty(), "an abandoned handler's outcome must be ignored"
        done = _job(lambda: None, 9)
        pool.submit(done)
        assert pool.finished.get(timeout=5) is done and done.error is None
        assert pool.threads == 4, "idle threads are reused"
    finally:
        release.set()
        pool.close()


def test_a_handler_thread_reports_base_exceptions_too() -> None:
    pool = HandlerThreads(1, spare=1, timeout_s=5, name="t-handler")
    try:
        job = _job(lambda: (_ for _ in ()).throw(SystemExit(4)))
        pool.submit(job)
        assert pool.finished.get(timeout=5) is job
        assert isinstance(job.error, SystemExit)
    finally:
        pool.close()


def test_handlers_that_would_run_nothing_are_refused() -> None:
    async def coroutine(body: Any) -> None: ...

    def generator(body: Any) -> Any:
        yield body

    class AsyncCall:
        async def __call__(self, body: Any) -> None: ...

    for handler in (coroutine, AsyncCall()):
        with pytest.raises(InvalidInput, match="AsyncConsumer"):
            check_handler(handler, sync=True)
        check_handler(handler, sync=False)
    with pytest.raises(InvalidInput, match="generator"):
        check_handler(generator, sync=False)
    with pytest.raises(InvalidInput, match="must be a function"):
        check_handler("not callable", sync=True)  # type: ignore[arg-type]


def test_a_wrapped_coroutine_fails_instead_of_succeeding() -> None:
    async def work() -> None: ...

    with pytest.raises(InvalidInput, match="returned a coroutine"):
        plain_result(work())
    plain_result(None)
    plain_result({"a": 1})


def _delivery(headers: dict[str, Any], redelivered: bool = False) -> Delivery:
    return Delivery(
        queue="work",
        body=b"{}",
        routing_key="job.x",
        message_id="p",
        content_type="application/json",
        headers=headers,
        redelivered=redelivered,
    )


def test_fresh_deliveries_are_told_from_redeliveries() -> None:
    assert is_fresh(False, {})
    assert is_fresh(False, None)
    assert not is_fresh(True, {})
    assert not is_fresh(False, {"x-delivery-count": 2})
    assert is_fresh(False, {"x-delivery-count": 0})


def test_a_deferred_copy_of_a_returned_message_is_not_fresh() -> None:
    """A claim left by a crashed consumer defers the message: its copy is republished as
    a new message carrying the returns. It must not end a cautious start, or the poison
    message runs beside prefetched neighbours and takes them down with it."""
    planner = DeliveryPlanner(TOPOLOGY, "work", clock_ms=lambda: 1_000)
    deferred = planner.deferred(_delivery({"x-delivery-count": 1}))
    assert deferred.message is not None
    assert not is_fresh(False, deferred.message.headers)
    assert is_fresh(False, {H_RETURNS: 0})


def test_a_deferral_carries_the_crash_count_and_stops_past_the_limit() -> None:
    planner = DeliveryPlanner(TOPOLOGY, "work", clock_ms=lambda: 1_000)
    fresh = planner.deferred(_delivery({}))
    assert fresh.action is Action.RETRY and fresh.message is not None
    assert H_RETURNS not in fresh.message.headers
    # Redelivered after a crash (count 1), and a copy that came back from a deferral.
    once = planner.deferred(_delivery({"x-delivery-count": 1}, redelivered=True))
    assert once.message is not None and once.message.headers[H_RETURNS] == 1
    again = planner.deferred(_delivery({H_RETURNS: 2, "x-delivery-count": 1}, True))
    assert again.action is Action.RETRY and again.message is not None
    assert again.message.headers[H_RETURNS] == 3  # at the limit: one more try
    over = planner.deferred(_delivery({H_RETURNS: 3, "x-delivery-count": 1}, True))
    assert over.action is Action.DEAD_LETTER and over.message is not None
    assert over.message.headers[H_DEAD_LETTER_REASON] == "delivery-limit"
    assert over.message.routing_key == "work.dlq"
    assert planner.over_delivery_limit(_delivery({H_RETURNS: 4})) is not None
    assert planner.over_delivery_limit(_delivery({"x-delivery-count": 3}, True)) is None
    for junk in ("7", -5, True, 2.5):  # a bad header counts as nothing carried
        assert _delivery({H_RETURNS: junk}).returns == 0


class _AsyncCall:
    async def __call__(self, body: Any, tx: Any = None) -> None: ...


def test_an_async_call_object_is_a_coroutine_handler_for_the_worker(tmp_path: Any) -> None:
    from delayq import SQLiteStore
    from delayq.aio import AsyncConsumer

    worker = Worker(TOPOLOGY)
    worker.handler("work")(_AsyncCall())
    assert worker.registrations[0].is_async  # so it goes to an AsyncConsumer, awaited
    with pytest.raises(InvalidInput, match="transactional handler is a plain function"):
        AsyncConsumer(
            "amqp://guest:guest@127.0.0.1:1/",
            TOPOLOGY,
            "work",
            _AsyncCall(),
            store=SQLiteStore(tmp_path / "k.db"),
            transactional=True,
        )


@pytest.mark.parametrize("adapter", ["sync", "async"])
def test_a_plain_handler_returning_a_coroutine_is_dead_lettered_not_acked(
    memory_broker: Any, adapter: str
) -> None:
    from delayq import FixedBackoff
    from delayq.aio import AsyncConsumer
    from delayq.consume.delivery import H_ERROR_TYPE
    from delayq.sync import Consumer, Publisher

    async def send(body: Any) -> None: ...

    options: dict[str, Any] = {"policy": FixedBackoff(delay="1s", max_attempts=2)}
    handler = lambda body: send(body)  # noqa: E731 - the wrapper a user would write
    if adapter == "sync":
        consumer: Any = Consumer(memory_broker.url, TOPOLOGY, "work", handler, **options)
        consumer.start()
    else:
        consumer = AsyncConsumer(memory_broker.url, TOPOLOGY, "work", handler, **options)
        asyncio.run(consumer.start())
    with Publisher(memory_broker.url, TOPOLOGY) as pub:
        pub.publish({"n": 1}, "job.x", "0s", message_id="wrapped")
    if adapter == "sync":
        memory_broker.run_until_idle()
    else:
        asyncio.run(memory_broker.run_until_idle_async())
    dead = memory_broker.dlq("work")
    assert [m.message_id for m in dead] == ["wrapped"]
    assert str(dead[0].headers[H_ERROR_TYPE]).endswith("InvalidInput")
    assert consumer.stats.handled == 0 and consumer.stats.retried == 1
