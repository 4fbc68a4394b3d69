"""RabbitMQ before 3.13.3 drops, by its dead-letter cycle detection, a message whose
``x-death`` already names the queue it is dead-lettered to: confirmed, then gone, with a
line in the broker's log only. From 3.13.3 on (4.x included) the broker no longer takes
a publisher's ``x-death`` for its own history, and the copy arrives. delayq never sends
such a header (its publisher refuses ``x-`` headers, its retries and replays strip them);
this proves, on each version, what the docs warn raw publishers about."""

from __future__ import annotations

from typing import Any

import pika
import pytest

from delayq.errors import InvalidHeaders
from delayq.sync import Publisher, apply_topology
from delayq.sync._link import pika_properties
from tests.waiting import wait_for

from .conftest import Collector


def test_a_raw_message_whose_x_death_names_the_destination_is_dropped_before_3_13_3(
    make_topology: Any, rabbitmq_url: str, rabbitmq_version: tuple[int, ...]
) -> None:
    topo = make_topology(["1s"])
    apply_topology(topo, rabbitmq_url)
    work = f"{topo.namespace}.work"
    collector = Collector(rabbitmq_url, [work]).start()
    try:
        with Publisher(rabbitmq_url, topo) as pub:
            # What a home-made replay does: a consumed message's headers, x-death included,
            # published again into a tier.
            copied = pub.factory.build({"n": 1}, "job.a", "1s", message_id="cycled")
            properties = pika_properties(copied)
            properties.headers = {
                **(properties.headers or {}),
                "x-death": [
                    {
                        "queue": work,
                        "reason": "expired",
                        "count": 1,
                        "exchange": topo.ready_exchange,
                        "routing-keys": ["job.a"],
                    }
                ],
            }
            connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
            try:
                channel = connection.channel()
                channel.confirm_delivery()
                channel.basic_publish(  # confirmed: raises if nacked or returned
                    copied.exchange, copied.routing_key, copied.body, properties, mandatory=True
                )
            finally:
                connection.close()
            # delayq's own publisher refuses the header outright ...
            with pytest.raises(InvalidHeaders, match="x-"):
                pub.publish({"n": 2}, "job.a", "1s", headers={"x-death": []})
            # ... and a control message through the same tier, after the copied one.
            pub.publish({"n": 3}, "job.a", "1s", message_id="control")
        # Wait for the control: the tier released both by then, the copied one first.
        wait_for(
            lambda: any(a.message_id == "control" for a in collector.arrivals),
            30,
            "the control message in the work queue",
        )
        if rabbitmq_version >= (3, 13, 3):
            wait_for(lambda: len(collector.arrivals) == 2, 30, "both messages")
            assert [a.message_id for a in collector.arrivals] == ["cycled", "control"]
        else:
            assert [a.message_id for a in collector.arrivals] == ["control"]
    finally:
        collector.stop()


def test_the_bridge_forwards_no_broker_history_so_a_plugin_publishers_x_death_arrives(
    make_topology: Any, rabbitmq_url: str
) -> None:
    """A plugin-style publisher republishing dead letters with their headers (x-death
    naming the destination, reasons expired and delivery_limit) through an intake: the
    bridge leaves the broker's history out of each forward, so all arrive on every
    version, and the tier does not stall behind them (on 3.10.8 forty of them once stopped
    a tier for good: dropped by cycle detection, held as dead letters)."""
    from delayq.sync.bridge import Bridge
    from tests.integration.intake_support import Running, with_intake

    topology = with_intake(make_topology(["1s"]))
    apply_topology(topology, rabbitmq_url)
    work = f"{topology.namespace}.work"
    collector = Collector(rabbitmq_url, [work]).start()
    running = Running(Bridge(rabbitmq_url, topology))
    try:
        connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
        channel = connection.channel()
        channel.confirm_delivery()
        for n in range(60):
            reason = ("expired", "delivery_limit", "rejected")[n % 3]
            death = {"queue": work, "reason": reason, "count": 1,
                     "exchange": topology.ready_exchange, "routing-keys": ["job.a"]}  # fmt: skip
            headers = {"x-delay": 200, "x-death": [death], "x-first-death-queue": work,
                       "x-first-death-reason": reason, "x-last-death-queue": work,
                       "x-delivery-count": 3, "x-received-from": [], "x-app": "kept"}  # fmt: skip
            props = pika.BasicProperties(message_id=f"d{n}", headers=headers)
            channel.basic_publish(topology.intakes[0].exchange, "job.a", b"{}", props,
                                  mandatory=True)  # fmt: skip
        connection.close()
        wait_for(lambda: len(collector.arrivals) >= 60, 60, lambda: f"{len(collector.arrivals)}")
        arrived = sorted(a.message_id for a in collector.arrivals)
        assert arrived == sorted(f"d{n}" for n in range(60))
        headers = collector.arrivals[0].headers  # the tier's own death only, not the copied
        assert all(d.get("queue") != work for d in headers.get("x-death", [])), headers
        assert headers.get("x-first-death-queue") != work, headers
        assert "x-received-from" not in headers and headers.get("x-app") == "kept"
    finally:
        running.stop()
        collector.stop()
