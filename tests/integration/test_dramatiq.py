""":class:`delayq.integrations.dramatiq.DelayqBroker` on a real broker: Dramatiq's
``Retries`` back-off waits in delayq's tiers, a delayed message keeps its priority, and
misuse is refused with nothing sent."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

import dramatiq
import pika
import pytest
from dramatiq.middleware import Middleware

from delayq import InvalidDelay, InvalidInput, Topology, TopologyMissing
from delayq.integrations.dramatiq import DelayqBroker
from tests.waiting import first_message


@pytest.fixture
def queue_name(names: Callable[[str], str]) -> Callable[[], str]:
    """Unique Dramatiq queue names; each queue, its .DQ and .XQ deleted after."""
    return lambda: names("dr")


class Watch(Middleware):  # type: ignore[misc]
    def __init__(self) -> None:
        self.held = 0
        self.runs: list[float] = []
        self.done = threading.Event()

    def before_delay_message(self, broker: Any, message: Any) -> None:
        self.held += 1

    def before_process_message(self, broker: Any, message: Any) -> None:
        self.runs.append(time.monotonic())


def test_retries_back_off_in_the_tiers_not_in_the_worker(
    rabbitmq_url: str, queue_name: Callable[[], str], make_topology: Callable[..., Topology]
) -> None:
    queue = queue_name()
    broker = DelayqBroker(url=rabbitmq_url, topology=make_topology(ladder=["1s"], destinations=[]))
    watch = Watch()
    broker.add_middleware(watch)

    def flaky() -> None:
        if len(watch.runs) < 3:
            raise RuntimeError("not yet")
        watch.done.set()

    # Dramatiq's back-off is min_backoff * 2**retries * U(1, 2), capped to 50-100 % of max
    retries = {"max_retries": 3, "min_backoff": 600, "max_backoff": 1000}
    actor = dramatiq.actor(flaky, broker=broker, queue_name=queue, actor_name=queue, **retries)
    worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=100)
    worker.start()
    try:
        actor.send()
        assert watch.done.wait(60), watch.runs
    finally:
        worker.stop()
        broker.close()
    gaps = [b - a for a, b in itertools.pairwise(watch.runs)]
    assert len(watch.runs) == 3 and all(gap >= 0.9 for gap in gaps), gaps  # the 1 s tier
    assert watch.held == 0  # never held unacked by the worker


def test_a_delayed_message_keeps_its_priority_and_loses_its_eta(
    rabbitmq_url: str, queue_name: Callable[[], str], make_topology: Callable[..., Topology]
) -> None:
    queue = queue_name()
    broker = DelayqBroker(
        url=rabbitmq_url, max_priority=10, topology=make_topology(ladder=["1s"], destinations=[])
    )
    actor = dramatiq.actor(
        lambda: None, broker=broker, queue_name=queue, actor_name=queue, max_retries=0
    )
    sent = actor.send_with_options(delay=500, broker_priority=7)
    method, properties, body = first_message(rabbitmq_url, queue)
    broker.close()
    assert method is not None, "never arrived"
    arrived = dramatiq.Message.decode(body)
    assert arrived.message_id == sent.message_id and arrived.queue_name == queue
    assert "eta" not in arrived.options and properties.priority == 7
    assert properties.delivery_mode == 2


def test_misuse_is_refused_with_nothing_sent(
    rabbitmq_url: str, queue_name: Callable[[], str], make_topology: Callable[..., Topology]
) -> None:
    topology = make_topology(ladder=["1s"], destinations=[])
    with pytest.raises(InvalidInput, match="url="):
        DelayqBroker(host="localhost", topology=topology)
    queue = queue_name()
    broker = DelayqBroker(url=rabbitmq_url, topology=topology)
    actor = dramatiq.actor(
        lambda: None, broker=broker, queue_name=queue, actor_name=queue, max_retries=0
    )
    for bad in (-1, float("nan"), "10s", True, 1e300):
        with pytest.raises(InvalidDelay):
            actor.send_with_options(delay=bad)
    broker.close()
    # not applied, and not applied by the broker: a clear error at the first declaration
    unapplied = DelayqBroker(
        url=rabbitmq_url, apply=False, topology=make_topology(ladder=["1s"], destinations=[])
    )
    other = queue_name()
    actor = dramatiq.actor(
        lambda: None, broker=unapplied, queue_name=other, actor_name=other, max_retries=0
    )
    with pytest.raises(TopologyMissing, match="delayq topology apply"):
        actor.send_with_options(delay=1000)
    unapplied.close()
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    for name in (queue, f"{queue}.DQ"):  # refused before Dramatiq declared anything
        with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="NOT_FOUND"):
            connection.channel().queue_declare(name, passive=True)
    connection.close()


def test_an_actor_whose_back_off_the_ladder_cannot_hold_is_refused_at_declaration(
    rabbitmq_url: str, queue_name: Callable[[], str], make_topology: Callable[..., Topology]
) -> None:
    broker = DelayqBroker(url=rabbitmq_url, topology=make_topology(ladder=["1s", "1m"]))
    queue = queue_name()
    with pytest.raises(InvalidInput, match=r"up to 168h .*max_backoff=60000 or less"):
        dramatiq.actor(lambda: None, broker=broker, queue_name=queue, actor_name="default")
    with pytest.raises(InvalidInput, match="max_backoff"):
        dramatiq.actor(lambda: None, broker=broker, queue_name=queue, max_backoff=61_000)
    # within the ladder, or never retried: declared
    dramatiq.actor(lambda: None, broker=broker, queue_name=queue, max_backoff=60_000)
    dramatiq.actor(lambda: None, broker=broker, queue_name=queue, actor_name="n", max_retries=0)
    dramatiq.actor(lambda: None, broker=broker, queue_name=queue, actor_name="t", throws=Exception)
    broker.close()
    exact = make_topology(ladder=["1s"], strategy="exact", exact={"unit": "100ms", "levels": 8})
    broker = DelayqBroker(url=rabbitmq_url, topology=exact)
    with pytest.raises(InvalidInput, match="at most 237 bytes"):  # 255 - 8 * 2 - 2
        dramatiq.actor(lambda: None, broker=broker, queue_name="q" * 238, max_retries=0)
    dramatiq.actor(lambda: None, broker=broker, queue_name="q" * 237, max_retries=0)
    broker.close()


@pytest.mark.parametrize(
    ("asked", "reason"),
    [(3_600_000, "longer than the largest tier 1s"), (float("inf"), "longer than any tier"),
     (-5, "not a number of milliseconds")],
)  # fmt: skip
def test_a_retry_delayq_cannot_schedule_is_dead_lettered_with_its_reason_not_lost(
    rabbitmq_url: str,
    queue_name: Callable[[], str],
    make_topology: Callable[..., Topology],
    asked: float,
    reason: str,
) -> None:
    queue = queue_name()
    broker = DelayqBroker(url=rabbitmq_url, topology=make_topology(ladder=["1s"], destinations=[]))
    watch = Watch()
    broker.add_middleware(watch)

    def asks() -> None:
        raise dramatiq.Retry(delay=asked)  # type: ignore[arg-type]  # Dramatiq's own way

    actor = dramatiq.actor(
        asks, broker=broker, queue_name=queue, actor_name=queue, max_backoff=1000
    )
    worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=100)
    worker.start()
    sent = actor.send()
    method, _, body = first_message(rabbitmq_url, f"{queue}.XQ")
    worker.stop()
    broker.close()
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    depth = connection.channel().queue_declare(queue, passive=True).method.message_count
    connection.close()
    assert method is not None, "the retry was lost"
    parked = dramatiq.Message.decode(body)
    assert parked.message_id == sent.message_id and len(watch.runs) == 1
    assert reason in parked.options["delayq_reason"], parked.options
    assert depth == 0  # the delivery was settled, not left to run again


def test_the_exact_strategy_runs_a_message_within_a_unit_of_its_delay(
    rabbitmq_url: str, queue_name: Callable[[], str], make_topology: Callable[..., Topology]
) -> None:
    """Through the cascade's delivery exchange, which the broker binds its queues to."""
    queue = queue_name()
    topology = make_topology(
        ladder=["1h"], destinations=[], strategy="exact", exact={"unit": "100ms", "levels": 15}
    )
    broker = DelayqBroker(url=rabbitmq_url, topology=topology)
    watch = Watch()
    broker.add_middleware(watch)
    actor = dramatiq.actor(
        lambda: watch.done.set(), broker=broker, queue_name=queue, actor_name=queue, max_retries=0
    )
    worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=100)
    worker.start()
    try:
        actor.send()  # connected and bound before the timed send
        assert watch.done.wait(30)
        watch.done.clear()
        sent = time.monotonic()
        actor.send_with_options(delay=1_300)
        assert watch.done.wait(30), "the exact delay never ran"
        took = watch.runs[-1] - sent
    finally:
        worker.stop()
        broker.close()
    assert 1.3 <= took < 10, took  # 13 units of 100 ms and the hops, not the 1 h tier
