"""The broker's consumer timeout firing on a delivery delayq's handler still holds (its
``handler_timeout`` set longer than the broker's ``consumer_timeout``). Up to 4.2 the
broker closes the channel; on 4.3 a quorum queue returns the delivery and cancels the
consumer instead. On every version the consumer must come back and go on consuming,
and every message must take effect once."""

from __future__ import annotations

import time
from typing import Any

import pytest

from delayq import FixedBackoff, Message
from delayq.sync import Publisher
from tests.faults.test_faults import _verdict
from tests.faults.workload import ConsumerThread, Effects, SlowOnce, leftovers, make_topology
from tests.versions import consumer_timeout_cancels

TIMEOUT_MS = 5_000
FIRST, THEN = range(5), range(5, 10)


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_a_delivery_held_past_the_brokers_consumer_timeout_loses_and_stops_nothing(
    kind: str, fault_node: Any, reliability: Any, tmp_path: Any
) -> None:
    node = fault_node(consumer_timeout=str(TIMEOUT_MS))
    topo = make_topology(["1s"])
    effects = Effects(tmp_path / "app.db")
    slow_once = SlowOnce(TIMEOUT_MS / 1000 + 6)  # past the broker's timeout, not delayq's

    consumer = ConsumerThread(
        node.url, topo, effects, kind, handler=slow_once, handler_timeout="60s",
        policy=FixedBackoff(delay="1s", max_attempts=5),
    )  # fmt: skip
    started = time.monotonic()
    try:
        with Publisher(node.url, topo) as pub:
            pub.publish_many([Message({"n": n}, "job.t", "0s", message_id=f"m{n}") for n in FIRST])
        effects.wait_for(set(FIRST), timeout_s=60)
        # still consuming after the broker's timeout (4.3: after its cancel)
        with Publisher(node.url, topo) as pub:
            pub.publish_many([Message({"n": n}, "job.t", "0s", message_id=f"m{n}") for n in THEN])
        effects.wait_for(set(range(10)), timeout_s=60)
        time.sleep(1)  # a late duplicate would land now
        counts = effects.counts()
        stats = consumer.stats
    finally:
        consumer.stop()
    lost, doubles = _verdict(set(range(10)), counts)
    left = leftovers(node.url, topo)
    reliability(
        f"a delivery held past the broker's consumer_timeout ({TIMEOUT_MS} ms; {kind} "
        "consumer, handler_timeout 60 s)",
        messages=10, faults=1, lost=lost, doubles=doubles, recover_s="",
        duration_s=round(time.monotonic() - started),
        notes=f"RabbitMQ {node.version}: reconnects {stats.reconnects}, attempts of the slow "
        f"message {slow_once.attempts.get(0)}",
    )  # fmt: skip
    assert lost == 0 and doubles == 0 and not left, (lost, doubles, left)
    if consumer_timeout_cancels(node.version):
        assert stats.reconnects >= 1, stats  # the broker's cancel seen, and consumed again
