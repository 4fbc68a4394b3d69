"""A message delayq puts back (its store is down, its republish was refused) is counted
toward the queue's delivery limit on every server, so one that can never be handled
reaches the DLQ instead of cycling for ever.

RabbitMQ 4.3 counts a ``basic.reject`` with requeue toward a quorum queue's
``x-delivery-count`` (and ``x-delivery-limit``), a ``basic.nack`` only toward
``x-acquired-count``: a put-back by nack there came back without end.
"""

from __future__ import annotations

import time
from typing import Any

from delayq import Topology
from delayq.stores.memory import InMemoryStore
from delayq.sync import Publisher, apply_topology
from tests.amqp import depth
from tests.integration.test_poison import _drain

LIMIT = 2


class DownStore(InMemoryStore):
    """An idempotency store that cannot be reached: every claim fails."""

    def __init__(self) -> None:
        super().__init__()
        self.claims = 0

    def claim(self, key: str, *, lease_ms: int, now_ms: int, generation: int = 0) -> Any:
        self.claims += 1
        raise ConnectionError("the store is down")


def test_a_message_put_back_each_time_reaches_the_dlq_at_the_delivery_limit(
    make_topology: Any, rabbitmq_url: str, start_consumer: Any
) -> None:
    ns = make_topology(["1s"]).namespace
    topology = Topology(
        namespace=ns,
        ladder=["1s"],
        destinations=[{"queue": f"{ns}.work", "bindings": ["job.#"], "delivery_limit": LIMIT}],
    )
    queue = f"{ns}.work"
    apply_topology(topology, rabbitmq_url)
    store = DownStore()
    handled: list[Any] = []
    handle = start_consumer(topology, queue, handled.append, store=store, key=lambda b: b["id"])
    with Publisher(rabbitmq_url, topology) as pub:
        pub.publish({"id": "a"}, "job.a", "0s", message_id="m-a")
    deadline = time.monotonic() + 60  # LIMIT + 1 put-backs, a second apart
    while depth(rabbitmq_url, f"{queue}.dlq") == 0:
        assert time.monotonic() < deadline, f"still cycling after {store.claims} put-backs"
        time.sleep(0.2)
    handle.stop(10)
    [(props, _)] = _drain(rabbitmq_url, f"{queue}.dlq")
    assert props.message_id == "m-a" and not handled
    assert props.headers["x-death"][0]["reason"] == "delivery_limit", props.headers
    assert store.claims == LIMIT + 1, store.claims  # tried each time, never more
    assert _drain(rabbitmq_url, queue) == []
