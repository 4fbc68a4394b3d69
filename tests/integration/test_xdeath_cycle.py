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
