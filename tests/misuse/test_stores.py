"""Idempotency stores used the wrong way (issue 12, item 1 and its neighbours).

Shared stores (two workers of different namespaces, a sync and an async consumer,
competing consumers of one queue, transactional handlers on fan-out queues), a
closed store, bad store paths and options, and key functions that return what
cannot be a key: each ends in a clear delayq error or the correct outcome, and
nothing confirmed is lost.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from delayq import InMemoryStore, InvalidInput, SQLiteStore, StoreError, Topology, Worker
from delayq.aio import AsyncConsumer
from delayq.stores.key_scope import KeyScope, scoped_key
from delayq.sync import Consumer, Publisher, apply_topology
from tests.integration.conftest import AsyncConsumerHandle, SyncConsumerHandle
from tests.integration.test_key_scope import (
    ROUTING_KEY,
    Ledger,
    fan_out_topology,
    handler_for,
    run_worker,
)
from tests.waiting import wait_for

DEAD_URL = "amqp://guest:x@127.0.0.1:1/"


def test_one_store_shared_by_two_workers_of_different_namespaces(
    make_topology, rabbitmq_url, tmp_path
):
    """Two applications (namespaces) on one broker, one SQLite file, the same business
    key in both: each handles its own message. On 0.1 the second was skipped."""
    store = SQLiteStore(tmp_path / "keys.db")
    ledger = Ledger()
    stops, queues = [], []
    for _ in range(2):
        topology, (queue, _) = fan_out_topology(make_topology)
        topology = topology.model_copy(update={"destinations": topology.destinations[:1]})
        apply_topology(topology, rabbitmq_url)
        stops.append(run_worker(rabbitmq_url, topology, [queue], store, "sync", ledger))
        queues.append(queue)
        with Publisher(rabbitmq_url, topology) as publisher:
            publisher.publish({"order": 42}, ROUTING_KEY, "0s")
    try:
        ledger.wait_settled(queues, 1)
    finally:
        for stop in stops:
            stop()
        store.close()
    assert ledger.runs == dict.fromkeys(queues, 1)


def test_one_store_object_given_to_a_sync_and_an_async_consumer(make_topology, rabbitmq_url):
    """The same InMemoryStore object in a pika consumer's thread and an asyncio one:
    each queue handles the fanned-out message once; stopping them leaves it usable."""
    topology, queues = fan_out_topology(make_topology)
    apply_topology(topology, rabbitmq_url)
    store = InMemoryStore()
    ledger = Ledger()
    options: dict[str, Any] = {"store": store, "observers": [ledger]}
    handles = [
        SyncConsumerHandle(
            Consumer(
                rabbitmq_url, topology, queues[0], handler_for(ledger, queues[0], "sync"), **options
            )
        ),
        AsyncConsumerHandle(
            AsyncConsumer(
                rabbitmq_url,
                topology,
                queues[1],
                handler_for(ledger, queues[1], "async"),
                **options,
            )
        ),
    ]
    try:
        with Publisher(rabbitmq_url, topology) as publisher:
            publisher.publish({"order": 7}, ROUTING_KEY, "0s")
        ledger.wait_settled(queues, 1)
    finally:
        for handle in handles:
            handle.stop(10)
    assert ledger.runs == dict.fromkeys(queues, 1)
    assert store.claim("after", lease_ms=1_000, now_ms=0).value == "claimed"  # not closed


def test_competing_consumers_of_one_queue_still_skip_a_duplicate(
    make_topology, rabbitmq_url, tmp_path
):
    """Per-queue scope is shared by every consumer of that queue (replicas): a message
    published twice with one id runs once in all."""
    topology = make_topology()
    queue = topology.destinations[0].queue
    apply_topology(topology, rabbitmq_url)
    store = SQLiteStore(tmp_path / "keys.db")
    ledger = Ledger()
    handles = [
        SyncConsumerHandle(
            Consumer(
                rabbitmq_url,
                topology,
                queue,
                handler_for(ledger, queue, "sync"),
                store=store,
                observers=[ledger],
            )
        )
        for _ in range(2)
    ]
    try:
        with Publisher(rabbitmq_url, topology) as publisher:
            message_id = f"m-{uuid.uuid4().hex}"
            publisher.publish({"n": 1}, "job.x", "0s", message_id=message_id)
            publisher.publish({"n": 1}, "job.x", "0s", message_id=message_id)
        # Racing replicas: the loser is deferred (busy) and comes back a duplicate.
        wait_for(
            lambda: ledger.outcomes.get(queue, []).count("duplicate") >= 1, 30, "the duplicate"
        )
    finally:
        for handle in handles:
            handle.stop(10)
        store.close()
    assert ledger.runs == {queue: 1}
    assert ledger.outcomes[queue].count("ack") == 1


def test_a_closed_store_loses_nothing(make_topology, rabbitmq_url, tmp_path):
    """A consumer given a closed store cannot record keys: it returns each delivery
    to its queue (never acks it) and logs the StoreError; with a new store the
    message is handled once."""
    topology = make_topology()
    queue = topology.destinations[0].queue
    apply_topology(topology, rabbitmq_url)
    closed = SQLiteStore(tmp_path / "keys.db")
    closed.close()
    ledger = Ledger()
    consumer = Consumer(
        rabbitmq_url, topology, queue, handler_for(ledger, queue, "sync"), store=closed
    )
    handle = SyncConsumerHandle(consumer)
    try:
        with Publisher(rabbitmq_url, topology) as publisher:
            publisher.publish({"n": 1}, "job.x", "0s")
        wait_for(lambda: consumer.stats.returned >= 1, 30, "the delivery to be returned")
    finally:
        handle.stop(10)
    assert ledger.runs[queue] == 0
    fresh = SQLiteStore(tmp_path / "keys.db")
    handle = SyncConsumerHandle(
        Consumer(
            rabbitmq_url,
            topology,
            queue,
            handler_for(ledger, queue, "sync"),
            store=fresh,
            observers=[ledger],
        )
    )
    try:
        ledger.wait_settled([queue], 1)
    finally:
        handle.stop(10)
        fresh.close()
    assert ledger.runs[queue] == 1


def _key(body: dict[str, Any]) -> Any:
    return body["k"].encode() if body.get("bytes") else body["k"]


BAD_KEYS = [
    {"k": None},
    {"k": None},  # a second one: 0.1 stored "None" and skipped it as a duplicate
    {"k": ""},
    {"k": 1.5},
    {"k": True},
    {"k": [1]},
    {"k": "as-bytes", "bytes": True},
]
GOOD_KEYS = [{"k": "order-1"}, {"k": 2}]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_key_function_returning_what_cannot_be_a_key_dead_letters_that_message(
    kind, make_topology, rabbitmq_url
):
    topology = make_topology()
    queue = topology.destinations[0].queue
    apply_topology(topology, rabbitmq_url)
    ledger = Ledger()
    options: dict[str, Any] = {"store": InMemoryStore(), "key": _key, "observers": [ledger]}
    handler = handler_for(ledger, queue, kind)
    handle: Any = (
        SyncConsumerHandle(Consumer(rabbitmq_url, topology, queue, handler, **options))
        if kind == "sync"
        else AsyncConsumerHandle(AsyncConsumer(rabbitmq_url, topology, queue, handler, **options))
    )
    try:
        with Publisher(rabbitmq_url, topology) as publisher:
            for body in BAD_KEYS + GOOD_KEYS:
                publisher.publish(body, "job.x", "0s")
        ledger.wait_settled([queue], len(BAD_KEYS) + len(GOOD_KEYS))
    finally:
        handle.stop(10)
    assert ledger.runs[queue] == len(GOOD_KEYS)
    dead = [e for e in ledger.events if e.outcome == "dead-letter"]
    assert len(dead) == len(BAD_KEYS)
    for event in dead:
        assert event.reason.startswith("undecodable: the consumer's key function returned")
        assert "non-empty str" in event.reason


@pytest.mark.parametrize("kind", ["sync"])
def test_transactional_handlers_on_fan_out_queues_sharing_one_sqlite_file(
    kind, make_topology, rabbitmq_url, tmp_path
):
    """The inbox pattern with a shared file: each queue's handler commits its write
    with its own queue's key, so both writes happen, once each."""
    import sqlite3

    topology, queues = fan_out_topology(make_topology)
    apply_topology(topology, rabbitmq_url)
    path = tmp_path / "app.db"
    store = SQLiteStore(path)
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE effects (queue TEXT, n INTEGER)")
    ledger = Ledger()

    def writer(queue: str) -> Callable[[Any, Any], None]:
        def write(body: Any, tx: Any) -> None:
            tx.execute("INSERT INTO effects VALUES (?, ?)", (queue, body["n"]))

        return write

    handles = [
        SyncConsumerHandle(
            Consumer(
                rabbitmq_url,
                topology,
                q,
                writer(q),
                store=store,
                transactional=True,
                observers=[ledger],
            )
        )
        for q in queues
    ]
    try:
        with Publisher(rabbitmq_url, topology) as publisher:
            message_id = f"m-{uuid.uuid4().hex}"
            publisher.publish({"n": 5}, ROUTING_KEY, "0s", message_id=message_id)
            ledger.wait_settled(queues, 1)
            publisher.publish({"n": 5}, ROUTING_KEY, "0s", message_id=message_id)
            ledger.wait_settled(queues, 2)
    finally:
        for handle in handles:
            handle.stop(10)
        store.close()
    with sqlite3.connect(path) as db:
        rows = sorted(db.execute("SELECT queue, n FROM effects").fetchall())
    assert rows == sorted((q, 5) for q in queues)
    assert ledger.outcomes == {q: ["ack", "duplicate"] for q in queues}


# --- refused before anything runs ---------------------------------------------------------------


def _handler(body: Any) -> None:
    pass


@pytest.mark.parametrize("scope", ["global", "Queue", True, None])
def test_an_unknown_key_scope_is_refused_by_every_consumer_and_the_worker(scope):
    queue = "work"
    topology = Topology(
        namespace="scope", ladder=["1s"], destinations=[{"queue": queue, "bindings": ["a"]}]
    )
    declarations: list[Callable[[], object]] = [
        lambda: Consumer(DEAD_URL, topology, queue, _handler, key_scope=scope),
        lambda: AsyncConsumer(DEAD_URL, topology, queue, _handler, key_scope=scope),
        lambda: Worker(topology, key_scope=scope),
        lambda: Worker(topology).handler(queue, key_scope=scope)(_handler),
    ]
    for declare in declarations:
        with pytest.raises(InvalidInput, match="key_scope must be KeyScope"):
            declare()


def test_the_shared_scope_stores_keys_as_0_1_did_and_the_queue_scope_does_not():
    assert scoped_key("m-1", "orders.billing", KeyScope.SHARED) == "m-1"
    assert scoped_key("m-1", "orders.billing", KeyScope.QUEUE) == "q:orders.billing:m-1"
    assert scoped_key("x", "a:b", KeyScope.QUEUE) == "q:a%3Ab:x"


def test_a_store_file_in_a_missing_directory_is_created(tmp_path):
    store = SQLiteStore(tmp_path / "not" / "yet" / "keys.db")
    assert store.claim("k", lease_ms=1_000, now_ms=0).value == "claimed"
    store.close()


@pytest.mark.parametrize("where", ["a-directory", "under-a-file", "unwritable"])
def test_a_store_path_that_cannot_hold_a_database_is_a_store_error(where, tmp_path):
    if where == "a-directory":
        path = tmp_path
    elif where == "under-a-file":
        (tmp_path / "file").write_text("x")
        path = tmp_path / "file" / "keys.db"
    else:
        path = Path("/proc/delayq-cannot-write-here/keys.db")
    with pytest.raises(StoreError, match="cannot open the SQLite idempotency store"):
        SQLiteStore(path)


@pytest.mark.parametrize("path", [":memory:", "", 3])
def test_a_store_path_that_is_not_a_file_is_refused(path):
    with pytest.raises(InvalidInput, match="SQLiteStore needs a file path"):
        SQLiteStore(path)  # type: ignore[arg-type]


def test_store_options_with_a_unit_in_their_name_take_an_int():
    with pytest.raises(InvalidInput, match="busy_timeout_ms is whole milliseconds"):
        SQLiteStore("x.db", busy_timeout_ms="10s")  # type: ignore[arg-type]
    from delayq.stores.redis import RedisStore

    for wrong in ("7d", 0, True, 1.5):
        with pytest.raises(InvalidInput, match="retention_ms is a positive number"):
            RedisStore("redis://127.0.0.1:1/0", retention_ms=wrong)  # type: ignore[arg-type]
