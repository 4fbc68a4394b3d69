"""Idempotency keys are scoped per queue: a message fanned out to two queues that
share one store is handled once in each (issue 12, item 1).

Two queues bind the same routing key (``order.paid``) and share one store, as in
the README's Worker pattern. For every store (memory, SQLite, Redis, PostgreSQL),
through bare consumers and through a ``Worker``, sync and async: the message is
handled once in each queue, and a duplicate of it is skipped in each queue. On
0.1 one queue's handler never ran (its delivery counted as a duplicate).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from delayq import (
    InMemoryStore,
    KeyScope,
    Settled,
    SQLiteStore,
    Topology,
    Worker,
    copy_unscoped_keys,
)
from delayq.aio import AsyncConsumer
from delayq.stores.base import IdempotencyStore
from delayq.sync import Consumer, Publisher, apply_topology
from tests.integration.conftest import AsyncConsumerHandle, ConsumerHandle, SyncConsumerHandle
from tests.integration.store_servers import (  # noqa: F401 (fixtures)
    postgres_store,
    redis_client,
    redis_store,
)
from tests.waiting import wait_for

STORES = ["memory", "sqlite", "redis", "postgres"]
ROUTING_KEY = "order.paid"


class Ledger:
    """What the handlers did and how every delivery was settled, per queue."""

    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()
        self.outcomes: dict[str, list[str]] = {}
        self.events: list[Settled] = []
        self._lock = threading.Lock()

    def ran(self, queue: str) -> None:
        with self._lock:
            self.runs[queue] += 1

    def settled(self, event: Settled) -> None:
        with self._lock:
            self.outcomes.setdefault(event.queue, []).append(event.outcome)
            self.events.append(event)

    def wait_settled(self, queues: list[str], count: int, timeout_s: float = 30.0) -> None:
        def settled() -> bool:
            with self._lock:
                return all(len(self.outcomes.get(q, [])) >= count for q in queues)

        wait_for(settled, timeout_s, lambda: f"{count} settled per queue: {self.outcomes}")


@pytest.fixture
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    made: list[IdempotencyStore] = []

    def make(kind: str) -> IdempotencyStore:
        if kind == "memory":
            store: IdempotencyStore = InMemoryStore()
        elif kind == "sqlite":
            store = SQLiteStore(tmp_path / "keys.db")
        else:  # closed and cleaned up by the servers' own fixtures
            return request.getfixturevalue(f"{kind}_store")()  # type: ignore[no-any-return]
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


def fan_out_topology(make_topology: Callable[..., Topology]) -> tuple[Topology, list[str]]:
    # Queue names with dots, as real ones have: the scoped key must stay unambiguous.
    suffix = uuid.uuid4().hex[:8]
    queues = [f"billing.{suffix}", f"shipping.{suffix}"]
    topology = make_topology(destinations=[{"queue": q, "bindings": [ROUTING_KEY]} for q in queues])
    return topology, queues


def handler_for(ledger: Ledger, queue: str, kind: str) -> Callable[[Any], Any]:
    if kind == "sync":

        def handle(body: Any) -> None:
            ledger.ran(queue)

        return handle

    async def handle_async(body: Any) -> None:
        await asyncio.sleep(0)
        ledger.ran(queue)

    return handle_async


def run_consumers(
    url: str, topology: Topology, queues: list[str], store: Any, kind: str, ledger: Ledger
) -> Callable[[], None]:
    handles: list[ConsumerHandle] = []
    for queue in queues:
        options: dict[str, Any] = {"store": store, "observers": [ledger]}
        handler = handler_for(ledger, queue, kind)
        if kind == "sync":
            handles.append(SyncConsumerHandle(Consumer(url, topology, queue, handler, **options)))
        else:
            consumer = AsyncConsumer(url, topology, queue, handler, **options)
            handles.append(AsyncConsumerHandle(consumer))

    def stop() -> None:
        for handle in handles:
            handle.stop(10)

    return stop


def run_worker(
    url: str, topology: Topology, queues: list[str], store: Any, kind: str, ledger: Ledger
) -> Callable[[], None]:
    # The README's pattern: one store for the whole worker, here with a business key.
    worker = Worker(topology, store=store, key=lambda body: f"order-{body['order']}")
    for queue in queues:
        worker.handler(queue)(handler_for(ledger, queue, kind))
    stop = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            worker.run(url, stop=stop, observers=[ledger])
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def halt() -> None:
        stop.set()
        thread.join(30)
        assert not failed, failed

    return halt


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("runner", ["consumers", "worker"])
@pytest.mark.parametrize("store_kind", STORES)
def test_a_fanned_out_message_is_handled_once_in_each_queue_sharing_a_store(
    store_kind, runner, kind, make_store, make_topology, rabbitmq_url
):
    topology, queues = fan_out_topology(make_topology)
    apply_topology(topology, rabbitmq_url)
    store = make_store(store_kind)
    ledger = Ledger()
    start = run_consumers if runner == "consumers" else run_worker
    stop = start(rabbitmq_url, topology, queues, store, kind, ledger)
    try:
        with Publisher(rabbitmq_url, topology) as publisher:
            first = f"m-{uuid.uuid4().hex}"
            publisher.publish({"order": 42}, ROUTING_KEY, "0s", message_id=first)
            ledger.wait_settled(queues, 1)
            # A duplicate: the same message id for the consumers (a re-sent publish), the
            # same business key under a new id for the worker (its key function).
            again = first if runner == "consumers" else f"m-{uuid.uuid4().hex}"
            publisher.publish({"order": 42}, ROUTING_KEY, "0s", message_id=again)
            ledger.wait_settled(queues, 2)
    finally:
        stop()
    assert ledger.runs == {queues[0]: 1, queues[1]: 1}
    assert ledger.outcomes == {q: ["ack", "duplicate"] for q in queues}


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_shared_keys_are_an_explicit_opt_in(kind, make_store, make_topology, rabbitmq_url):
    """``key_scope="shared"``: one key space, so the fanned-out copy is a duplicate."""
    topology, queues = fan_out_topology(make_topology)
    apply_topology(topology, rabbitmq_url)
    store = make_store("sqlite")
    ledger = Ledger()
    handles: list[ConsumerHandle] = []
    for queue in queues:
        handler = handler_for(ledger, queue, kind)
        options: dict[str, Any] = {
            "store": store,
            "observers": [ledger],
            "key_scope": KeyScope.SHARED,
        }
        if kind == "sync":
            handles.append(
                SyncConsumerHandle(Consumer(rabbitmq_url, topology, queue, handler, **options))
            )
        else:
            handles.append(
                AsyncConsumerHandle(
                    AsyncConsumer(rabbitmq_url, topology, queue, handler, **options)
                )
            )
    try:
        with Publisher(rabbitmq_url, topology) as publisher:
            publisher.publish({"order": 1}, ROUTING_KEY, "0s")
        # One runs; the other finds the key done (or, racing, busy: deferred, then done).
        ledger.wait_settled(queues, 1)
        wait_for(
            lambda: any("duplicate" in o for o in ledger.outcomes.values()),
            30,
            lambda: f"a duplicate: {ledger.outcomes}",
        )
    finally:
        for handle in handles:
            handle.stop(10)
    assert sum(ledger.runs.values()) == 1


@pytest.mark.parametrize("migrated", [False, True], ids=["not-migrated", "migrated"])
def test_a_key_done_by_0_1_counts_after_copy_unscoped_keys(
    migrated, make_store, make_topology, rabbitmq_url
):
    """0.1 wrote the bare message id. Without the migration a queue-scoped consumer
    does not see it (the redelivery runs); after ``copy_unscoped_keys`` it does."""
    topology = make_topology()
    queue = topology.destinations[0].queue
    apply_topology(topology, rabbitmq_url)
    store = make_store("sqlite")
    message_id = f"m-{uuid.uuid4().hex}"
    store.claim(message_id, lease_ms=60_000, now_ms=int(time.time() * 1000))
    store.complete(message_id, now_ms=int(time.time() * 1000))  # as 0.1 recorded it
    if migrated:
        assert copy_unscoped_keys(store, [queue]) == 1
    ledger = Ledger()
    handle = SyncConsumerHandle(
        Consumer(
            rabbitmq_url,
            topology,
            queue,
            handler_for(ledger, queue, "sync"),
            store=store,
            observers=[ledger],
        )
    )
    try:
        with Publisher(rabbitmq_url, topology) as publisher:
            publisher.publish({"n": 1}, "job.x", "0s", message_id=message_id)
        ledger.wait_settled([queue], 1)
    finally:
        handle.stop(10)
    assert ledger.outcomes[queue] == (["duplicate"] if migrated else ["ack"])
    assert ledger.runs[queue] == (0 if migrated else 1)
