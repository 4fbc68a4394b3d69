"""Handlers running at once, both adapters: a hung handler holds one slot while the
others keep flowing, is retried after its timeout, and nothing is lost or doubled;
``Worker.run(concurrency=...)`` applies to plain (threaded) handlers too."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from typing import Any

from delayq import FixedBackoff, Message, Worker
from delayq.sync import Publisher, apply_topology
from tests.integration.test_consumer import until

OTHERS = 49


def test_a_hung_handler_holds_one_slot_and_the_others_keep_flowing(
    make_topology, rabbitmq_url, start_consumer
):
    topo = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    hanging, release = threading.Event(), threading.Event()
    lock = threading.Lock()
    done: Counter[int] = Counter()
    retried_when_done: dict[int, int] = {}
    consumer: Any = None

    def handler(body: dict[str, int]) -> None:
        if body["n"] == 0 and not hanging.is_set():
            hanging.set()
            release.wait(60)  # hung, until the test ends; what it returns is ignored
            return
        with lock:
            done[body["n"]] += 1
            # Was the hung handler's timeout already acted on when this one finished?
            retried_when_done[body["n"]] = consumer.stats.retried

    consumer = start_consumer(
        topo,
        queue,
        handler,
        handler_timeout="6s",  # the default is 5 minutes: the others must not wait for it
        policy=FixedBackoff(delay="1s", max_attempts=3),
    )
    try:
        with Publisher(rabbitmq_url, topo) as pub:
            pub.publish_many(
                [Message({"n": n}, "job.h", "0s", message_id=f"h{n}") for n in range(OTHERS + 1)]
            )
        assert hanging.wait(20)
        assert until(lambda: len(done) >= OTHERS, 30), f"only {len(done)} handled"
        with lock:
            late = sorted(n for n, retried in retried_when_done.items() if retried)
        assert late == [], f"{len(late)} waited for the hung handler's timeout"
        # The hung one is retried after its timeout, and then handled.
        assert until(lambda: done[0] == 1, 30), "the hung message was never retried"
        assert until(lambda: consumer.stats.handled == OTHERS + 1, 10)
    finally:
        release.set()
    assert consumer.stats.retried == 1 and consumer.stats.dead_lettered == 0
    assert done == Counter(range(OTHERS + 1)), "a message was lost or handled twice"


def test_worker_concurrency_applies_to_plain_handlers(make_topology, rabbitmq_url):
    topo = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    worker = Worker(topo)
    lock = threading.Lock()
    running, peak, handled = [0], [0], [0]

    @worker.handler(queue)
    def handle(body: dict[str, int]) -> None:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        # Wait for company: with concurrency 3, three handlers are in here at once.
        deadline = time.monotonic() + 5
        while peak[0] < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        with lock:
            running[0] -= 1
            handled[0] += 1

    apply_topology(topo, rabbitmq_url)
    stop = threading.Event()
    thread = threading.Thread(
        target=worker.run, args=(rabbitmq_url,), kwargs={"concurrency": 3, "stop": stop}
    )
    thread.start()
    try:
        with Publisher(rabbitmq_url, topo) as pub:
            pub.publish_many([Message({"n": n}, "job.w", "0s") for n in range(12)])
        assert until(lambda: handled[0] == 12, 30)
    finally:
        stop.set()
        thread.join(60)
    assert peak[0] == 3, f"{peak[0]} plain handlers ran at once with concurrency 3"


def test_plain_handlers_of_the_async_consumer_run_up_to_its_concurrency(
    make_topology, rabbitmq_url
):
    """Plain handlers ran in the event loop's default executor, ``min(32, cpus + 4)``
    threads shared with everything else: ``concurrency`` above that was silently capped."""
    from delayq.aio import AsyncConsumer
    from tests.integration.conftest import AsyncConsumerHandle

    wanted = min(32, (os.cpu_count() or 1) + 4) + 2  # just past the default executor
    topo = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    lock = threading.Lock()
    running, peak = [0], [0]

    def handle(body: dict[str, int]) -> None:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        deadline = time.monotonic() + 5  # wait for company, as above
        while peak[0] < wanted and time.monotonic() < deadline:
            time.sleep(0.01)
        with lock:
            running[0] -= 1

    consumer = AsyncConsumerHandle(
        AsyncConsumer(rabbitmq_url, topo, queue, handle, prefetch=wanted, concurrency=wanted)
    )
    try:
        with Publisher(rabbitmq_url, topo) as pub:
            pub.publish_many([Message({"n": n}, "job.a", "0s") for n in range(2 * wanted)])
        assert until(lambda: consumer.stats.handled == 2 * wanted, 60)
    finally:
        consumer.stop()
    assert peak[0] == wanted, f"{peak[0]} plain handlers ran at once, not {wanted}"
