"""Cancel on a real broker: a cancelled message is never handled (issue 15).

Two queues bind the same routing key and share one store; sync and async consumers,
every store. Messages are cancelled before they are published, while parked in a tier,
and while waiting in a retry tier after a failed attempt: only the one never cancelled
is handled, once in each queue; the others are acked as ``cancelled``, never
dead-lettered. See ``docs/concepts/cancel.md``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from delayq import CancelStatus
from delayq.aio import AsyncConsumer
from delayq.sync import Consumer, Publisher, apply_topology
from tests.integration import test_key_scope as scope
from tests.integration.conftest import AsyncConsumerHandle, ConsumerHandle, SyncConsumerHandle
from tests.waiting import wait_for

# Fixtures shared with the key-scope suite (stores of every kind, cleaned up after).
make_store = scope.make_store
redis_store = scope.redis_store
redis_client = scope.redis_client
postgres_store = scope.postgres_store

ROUTING_KEY = scope.ROUTING_KEY


def _start(
    url: str, topology: Any, queues: list[str], store: Any, kind: str, ledger: Any
) -> Callable[[], None]:
    """Consumers whose handler fails the first attempt of a body marked ``flaky``."""
    failed: set[tuple[str, str]] = set()
    handles: list[ConsumerHandle] = []

    for queue in queues:

        def handle(body: Any, queue: str = queue) -> None:
            if body["name"] == "flaky" and (queue, "flaky") not in failed:
                failed.add((queue, "flaky"))
                raise RuntimeError("the first attempt fails")
            ledger.ran(f"{queue}:{body['name']}")

        async def handle_async(body: Any, queue: str = queue) -> None:
            handle(body, queue)

        options: dict[str, Any] = {"store": store, "observers": [ledger]}
        if kind == "sync":
            handles.append(SyncConsumerHandle(Consumer(url, topology, queue, handle, **options)))
        else:
            consumer = AsyncConsumer(url, topology, queue, handle_async, **options)
            handles.append(AsyncConsumerHandle(consumer))

    def stop() -> None:
        for h in handles:
            h.stop(10)

    return stop


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("store_kind", scope.STORES)
def test_cancelled_messages_are_never_handled_on_a_real_broker(
    store_kind, kind, make_store, make_topology, rabbitmq_url
):
    topology, queues = scope.fan_out_topology(make_topology)
    apply_topology(topology, rabbitmq_url)
    store = make_store(store_kind)
    ledger = scope.Ledger()
    stop = _start(rabbitmq_url, topology, queues, store, kind, ledger)
    run = uuid.uuid4().hex[:8]
    ids = {name: f"{name}-{run}" for name in ("early", "parked", "kept", "flaky")}
    try:
        with Publisher(rabbitmq_url, topology, store=store) as publisher:
            early = publisher.cancel(message_id=ids["early"], routing_key=ROUTING_KEY)
            for name in ("early", "parked", "kept"):
                publisher.publish({"name": name}, ROUTING_KEY, "4s", message_id=ids[name])
            publisher.publish({"name": "flaky"}, ROUTING_KEY, "0s", message_id=ids["flaky"])
            parked = publisher.cancel(message_id=ids["parked"], routing_key=ROUTING_KEY)

            def retrying() -> bool:  # flaky failed once in each queue: its retries wait
                return all("retry" in ledger.outcomes.get(q, []) for q in queues)

            wait_for(retrying, 30, lambda: f"flaky retried in both queues: {ledger.outcomes}")
            flaky = publisher.cancel(message_id=ids["flaky"], routing_key=ROUTING_KEY)
            ledger.wait_settled(queues, 5)  # flaky (retry, cancelled), early, parked, kept
    finally:
        stop()
    assert early.status is CancelStatus.UNKNOWN and early.cancelled
    assert parked.cancelled and flaky.cancelled, (parked, flaky)
    assert ledger.runs == {f"{q}:kept": 1 for q in queues}
    for queue in queues:
        outcomes = sorted(ledger.outcomes[queue])
        assert outcomes == ["ack", "cancelled", "cancelled", "cancelled", "retry"], outcomes
    assert all(e.outcome != "dead-letter" for e in ledger.events)
