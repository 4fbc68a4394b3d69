"""The asyncio consumer's coalesced acks on a real broker: acks still waiting for their
batch when the connection is lost cost a skipped duplicate each, never a loss or a second
effect; a failed handler between acked deliveries leaves the others' acks right (a wrong
multiple ack would close the channel: the consumer would have to reconnect)."""

from __future__ import annotations

import threading
from collections import Counter

import pika
import pytest

from delayq import InMemoryStore, Message
from delayq.aio import AsyncConsumer, _acks
from delayq.sync import Publisher
from tests.integration.conftest import AsyncConsumerHandle
from tests.waiting import wait_for


def ready(url: str, queue: str) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        return int(connection.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        connection.close()


def test_acks_pending_at_a_connection_loss_lose_nothing_and_run_nothing_twice(
    local_rabbitmq_node, make_topology, monkeypatch: pytest.MonkeyPatch
):
    # Acks wait for a batch (a quarter of the prefetch: 50) for an hour: the 30 handled
    # messages below are certainly unacked when the connection goes.
    monkeypatch.setattr(_acks, "ACK_DELAY_S", 3600.0)
    node = local_rabbitmq_node
    topo = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    effects: Counter[int] = Counter()
    lock = threading.Lock()

    async def handler(body: dict[str, int]) -> None:
        with lock:
            effects[body["n"]] += 1

    consumer = AsyncConsumerHandle(
        AsyncConsumer(node.url, topo, queue, handler, store=InMemoryStore(), prefetch=200)
    )
    try:
        with Publisher(node.url, topo) as pub:
            pub.publish_many([Message({"n": n}, "job.p", "0s") for n in range(30)])
        wait_for(lambda: consumer.stats.handled == 30, 30, "30 handled, their acks pending")
        assert ready(node.url, queue) == 0  # all 30 delivered
        # The cautious start (a prefetch of 1 until the first fresh delivery) acks at
        # once; from the widening on, acks wait for their batch.
        acked = consumer.consumer._acks.settled
        assert acked < 30
        node.ctl("close_all_connections", "delayq coalesced acks test", check=False)
        # Back in the queue, delivered again after the reconnect, skipped by the store.
        wait_for(
            lambda: consumer.stats.duplicates == 30 - acked,
            60,
            lambda: f"{30 - acked} duplicates skipped (stats: {consumer.stats})",
        )
        with Publisher(node.url, topo) as pub:
            pub.publish_many([Message({"n": n}, "job.p", "0s") for n in range(30, 40)])
        wait_for(lambda: consumer.stats.handled == 40, 30, "40 handled")
    finally:
        consumer.stop()  # sends the acks still waiting, then closes
    assert consumer.stats.reconnects >= 1
    assert sorted(effects) == list(range(40)) and max(effects.values()) == 1, effects
    wait_for(lambda: ready(node.url, queue) == 0, 10, "an empty queue after the stop")


def test_a_failed_handler_between_acked_ones_breaks_no_ack(rabbitmq_url, make_topology):
    topo = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    attempts: Counter[int] = Counter()
    lock = threading.Lock()

    async def handler(body: dict[str, int]) -> None:
        with lock:
            attempts[body["n"]] += 1
            first = attempts[body["n"]] == 1
        if first and body["n"] % 7 == 3:
            raise RuntimeError("fails once")  # retried: republished, then acked

    total = 300
    failing = sum(1 for n in range(total) if n % 7 == 3)
    consumer = AsyncConsumerHandle(
        AsyncConsumer(rabbitmq_url, topo, queue, handler, store=InMemoryStore(), prefetch=40)
    )
    try:
        with Publisher(rabbitmq_url, topo) as pub:
            pub.publish_many([Message({"n": n}, "job.f", "0s") for n in range(total)])
        wait_for(
            lambda: consumer.stats.handled == total,
            60,
            lambda: f"{total} handled (stats: {consumer.stats})",
        )
    finally:
        consumer.stop()
    assert consumer.stats.retried == failing
    assert consumer.stats.reconnects == 0  # no channel closed by a wrong ack
    assert consumer.stats.duplicates == 0
    wait_for(lambda: ready(rabbitmq_url, queue) == 0, 10, "an empty queue after the stop")
