"""Delivery records from both consumers against a real broker: one line per settled
delivery, all of them on disk once the consumer has stopped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from delayq import Message
from delayq.consume.delivery import Reject
from delayq.observe.records import DeliveryRecorder
from delayq.sync import apply_topology

from .test_consumer import publish, until


def test_every_settled_delivery_is_recorded_by_the_time_the_consumer_stops(
    make_topology: Any, rabbitmq_url: str, start_consumer: Any, tmp_path: Path
) -> None:
    topo = make_topology(["1s", "2s"])
    queue = f"{topo.namespace}.work"
    apply_topology(topo, rabbitmq_url)
    recorder = DeliveryRecorder(tmp_path)
    handled: list[Any] = []

    def handler(value: Any) -> None:
        if value == "reject":
            raise Reject("never")
        handled.append(value)

    consumer = start_consumer(topo, queue, handler, observers=[recorder])
    publish(
        rabbitmq_url,
        topo,
        *[Message(f"v{n}", "job.a", "1500ms", message_id=f"m{n}") for n in range(20)],
        Message("reject", "job.b", "0s", message_id="reject"),
    )
    assert until(lambda: len(handled) == 20, 15)
    consumer.stop(10)
    records = [
        json.loads(line)
        for path in sorted(tmp_path.glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    recorder.close()
    assert len(records) == 21
    by_id = {r["message_id"]: r for r in records}
    assert by_id["reject"]["outcome"] == "dead-letter" and by_id["reject"]["tier"] == "immediate"
    one = by_id["m3"]
    assert (one["v"], one["outcome"], one["tier"], one["tier_ms"]) == (1, "ack", "2s", 2000)
    assert one["requested_delay_ms"] == 1500 and one["queue"] == queue
    assert one["due_at_ms"] == one["published_at_ms"] + 1500
    assert one["delivered_at_ms"] >= one["published_at_ms"] + 2000
