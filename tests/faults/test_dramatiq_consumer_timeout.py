"""Dramatiq #827 on a real broker: Dramatiq's worker holds a delayed message unacked
until its time, so RabbitMQ's consumer timeout closes the channel and the message is
delivered again and again; through :class:`delayq.integrations.dramatiq.DelayqBroker`
it waits in a tier and reaches the worker once, when due. Both run side by side on one
node whose consumer timeout is 3 s (checked every 0.5 s). RabbitMQ 4.3 no longer applies
the consumer timeout to classic queues (Dramatiq's): there the worker holds the message
unacked, once, for all of its delay."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from typing import Any

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.middleware import Middleware

from delayq import Topology
from delayq.integrations.dramatiq import DelayqBroker
from tests.versions import classic_consumer_timeout

DELAY_MS = 10_000
TIMEOUT_MS = 3_000


class Watch(Middleware):  # type: ignore[misc]
    """What a worker did with each message: held it for later, ran it."""

    def __init__(self) -> None:
        self.held: Counter[str] = Counter()
        self.ran: dict[str, float] = {}
        self.done = threading.Event()

    def before_delay_message(self, broker: Any, message: Any) -> None:
        self.held[message.message_id] += 1

    def after_process_message(self, broker: Any, message: Any, *, result: Any = None,
                              exception: BaseException | None = None) -> None:  # fmt: skip
        self.ran[message.message_id] = time.monotonic()
        self.done.set()


def _send_and_run(broker: RabbitmqBroker, watch: Watch, queue: str) -> tuple[str, float]:
    broker.add_middleware(watch)
    actor = dramatiq.actor(
        lambda: None, broker=broker, queue_name=queue, actor_name=queue, max_retries=0
    )
    sent = time.monotonic()
    message = actor.send_with_options(delay=DELAY_MS)
    worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=100)
    worker.start()
    try:
        assert watch.done.wait(60), f"{queue}: the actor never ran"
    finally:
        worker.stop()
        broker.close()
    return message.message_id, sent


def test_a_delayed_message_past_the_consumer_timeout(fault_node: Any) -> None:
    node = fault_node(consumer_timeout=str(TIMEOUT_MS))
    node.ctl("eval", "application:set_env(rabbit, channel_tick_interval, 500).")
    stock, ours = Watch(), Watch()
    results: dict[str, tuple[str, float]] = {}
    tag = uuid.uuid4().hex[:6]
    runs = {
        "stock": lambda: _send_and_run(RabbitmqBroker(url=node.url), stock, f"stock{tag}"),
        "delayq": lambda: _send_and_run(
            DelayqBroker(url=node.url, topology=Topology(namespace=f"dq{tag}", ladder=["10s"])),
            ours, f"ours{tag}",
        ),
    }  # fmt: skip
    threads = [
        threading.Thread(target=lambda k=k, run=run: results.__setitem__(k, run()))
        for k, run in runs.items()
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    assert results.keys() == runs.keys(), results

    stock_id, _ = results["stock"]
    if classic_consumer_timeout(node.version):
        # Dramatiq's own: delivered, held past the broker's timeout, delivered again...
        assert stock.held[stock_id] >= 2, stock.held
    else:  # 4.3: held by the worker for all of its delay
        assert stock.held[stock_id] == 1, stock.held
    assert list(stock.ran) == [stock_id]  # ... and run once, in the end
    ours_id, ours_sent = results["delayq"]
    # delayq's: in the tier until due, never held by the worker, run once when due
    assert not ours.held, ours.held
    assert list(ours.ran) == [ours_id]
    assert ours.ran[ours_id] - ours_sent >= DELAY_MS / 1000 - 0.1
