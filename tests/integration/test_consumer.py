"""Consumers against a real broker, both adapters through one suite: retries on schedule,
DLQ with reasons, retries to the failing queue alone, dedup, timeouts, graceful stop."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from delayq import FixedBackoff, Message, ScheduleBackoff, Topology
from delayq.consume.delivery import H_DEAD_LETTER_REASON, H_ERROR_MESSAGE, H_ERROR_TYPE, Reject
from delayq.message.envelope import H_ATTEMPT
from delayq.message.factory import MessageFactory
from delayq.stores.sqlite import SQLiteStore
from delayq.sync import Publisher, apply_topology, delete_topology


class Calls:
    """What a handler saw, and when (handlers may run in worker threads)."""

    def __init__(self) -> None:
        self.values: list[Any] = []
        self.times: list[float] = []
        self._lock = threading.Lock()

    def record(self, value: Any) -> None:
        with self._lock:
            self.values.append(value)
            self.times.append(time.monotonic())


def until(predicate: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def publish(url: str, topo: Topology, *messages: Message) -> None:
    with Publisher(url, topo) as pub:
        pub.publish_many(list(messages))


def test_a_failing_handler_is_retried_on_schedule_then_dead_lettered(
    make_topology, rabbitmq_url, collect, start_consumer
):
    topo = make_topology(["1s", "2s"])
    queue = f"{topo.namespace}.work"
    apply_topology(topo, rabbitmq_url)
    dlq = collect(f"{queue}.dlq")
    calls = Calls()

    def handler(value: Any) -> None:
        calls.record(value)
        raise ValueError(f"boom {len(calls.values)}")

    consumer = start_consumer(topo, queue, handler, policy=ScheduleBackoff.of(["1s", "2s"]))
    publish(rabbitmq_url, topo, Message({"order": 1}, "job.fail", "0s", message_id="fails"))
    assert until(lambda: consumer.stats.dead_lettered == 1, 10)
    assert calls.values == [{"order": 1}] * 3
    first, second, third = calls.times
    assert 1.0 <= second - first <= 2.0, second - first
    assert 2.0 <= third - second <= 3.0, third - second
    [dead] = dlq.wait(1, timeout_s=5)
    assert dead.message_id == "fails"
    assert dead.headers[H_ATTEMPT] == 3
    assert text(dead.headers[H_DEAD_LETTER_REASON]) == "exhausted"
    assert "ValueError" in text(dead.headers[H_ERROR_TYPE])
    assert text(dead.headers[H_ERROR_MESSAGE]) == "boom 3"
    assert (consumer.stats.retried, consumer.stats.dead_lettered) == (2, 1)


def test_non_retryable_and_undecodable_go_straight_to_the_dlq_and_the_consumer_goes_on(
    make_topology, rabbitmq_url, collect, start_consumer
):
    topo = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    apply_topology(topo, rabbitmq_url)
    dlq = collect(f"{queue}.dlq")
    calls = Calls()

    def handler(value: Any) -> None:
        calls.record(value)
        if value.get("poison"):
            raise Reject("this order can never be processed")

    consumer = start_consumer(topo, queue, handler, prefetch=1)
    bad_json = MessageFactory(topo).build(b"{not json", "job.a", "0s", message_id="bad-json")
    object.__setattr__(bad_json, "content_type", "application/json")  # lies about its body
    with Publisher(rabbitmq_url, topo) as pub:
        pub.publish({"poison": True}, "job.a", "0s", message_id="poison")
        pub.send(bad_json)
        pub.publish({"ok": True}, "job.a", "0s", message_id="fine")
    assert until(lambda: consumer.stats.handled >= 1 and consumer.stats.dead_lettered >= 2, 10)
    dead = {a.message_id: a for a in dlq.wait(2, timeout_s=5)}
    assert set(dead) == {"poison", "bad-json"}
    assert text(dead["poison"].headers[H_DEAD_LETTER_REASON]) == "non-retryable"
    assert text(dead["bad-json"].headers[H_DEAD_LETTER_REASON]) == "undecodable"
    assert {"ok": True} in calls.values  # the consumer went on
    assert consumer.stats.retried == 0


def test_two_queues_on_one_key_a_retry_reaches_only_the_failing_one(
    make_topology, rabbitmq_url, start_consumer
):
    ns = make_topology(["1s"]).namespace
    topo = Topology.from_mapping(
        {
            "namespace": ns,
            "ladder": ["1s"],
            "destinations": [
                {"queue": f"{ns}.work", "bindings": ["order.created"]},
                {"queue": f"{ns}.audit", "bindings": ["order.created", "#"]},
            ],
        }
    )
    failing, audit = Calls(), Calls()

    def fail(value: Any) -> None:
        failing.record(value)
        raise RuntimeError("downstream is down")

    policy = FixedBackoff(delay="1s", max_attempts=4)
    a = start_consumer(topo, f"{ns}.work", fail, policy=policy)
    b = start_consumer(topo, f"{ns}.audit", audit.record)
    publish(rabbitmq_url, topo, Message({"order": 9}, "order.created", "0s"))
    assert until(lambda: a.stats.dead_lettered == 1, 10)
    time.sleep(1.0)
    a.stop()
    b.stop()
    delete_topology(topo, rabbitmq_url)
    assert len(failing.values) == 4
    assert audit.values == [{"order": 9}], "the other queue saw a retry"


@pytest.fixture(params=["sqlite", "redis", "postgres"])
def real_store(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    """An idempotency store on a real SQLite file, Redis server or PostgreSQL server."""
    unique = f"t{time.monotonic_ns()}"
    if request.param == "sqlite":
        return SQLiteStore(tmp_path / "keys.db")
    if request.param == "redis":
        from delayq import RedisStore

        return RedisStore(request.getfixturevalue("redis_url"), prefix=f"{unique}:")
    from delayq import PostgresStore

    return PostgresStore(request.getfixturevalue("postgres_dsn"), table=f"idem_{unique}")


@pytest.mark.parametrize("same", ["message-id", "business-key"])
def test_duplicates_run_the_side_effect_once(
    make_topology, rabbitmq_url, real_store, start_consumer, same
):
    topo = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    effects = Calls()
    store = real_store
    key = (lambda v: str(v["order"])) if same == "business-key" else None
    consumer = start_consumer(topo, queue, effects.record, store=store, key=key)
    if same == "message-id":
        batch = [Message({"order": 5}, "job.d", "0s", message_id="dup-1")] * 2
    else:
        batch = [Message({"order": 5}, "job.d", "0s", message_id=f"id-{n}") for n in range(2)]
    publish(rabbitmq_url, topo, *batch, Message({"order": 6}, "job.d", "0s", message_id="other"))
    assert until(lambda: consumer.stats.handled + consumer.stats.duplicates >= 3, 10)
    consumer.stop()
    store.close()
    assert sorted(v["order"] for v in effects.values) == [5, 6]
    assert consumer.stats.duplicates == 1


def test_a_handler_that_overruns_its_timeout_is_retried_not_stuck(
    make_topology, rabbitmq_url, start_consumer
):
    topo = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    calls = Calls()
    handles: list[Any] = []

    def handler(value: Any) -> None:
        calls.record(value)
        if len(calls.values) == 1:
            # Stuck the first time, past its timeout, until its retry is on its way: it
            # returns before the retry comes (a sync Consumer does not run a message's
            # retry beside its attempt still running).
            until(lambda: bool(handles) and handles[0].stats.retried >= 1, 10)

    started = time.monotonic()
    consumer = start_consumer(
        topo,
        queue,
        handler,
        handler_timeout="500ms",
        policy=FixedBackoff(delay="1s", max_attempts=3),
    )
    handles.append(consumer)
    publish(rabbitmq_url, topo, Message({"n": 1}, "job.t", "0s"))
    assert until(lambda: consumer.stats.handled == 1, 10)
    assert len(calls.values) == 2 and consumer.stats.retried == 1
    assert time.monotonic() - started < 10


def test_graceful_stop_finishes_in_flight_handlers_and_loses_nothing(
    make_topology, rabbitmq_url, start_consumer
):
    topo = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    done = Calls()

    def handler(value: Any) -> None:
        time.sleep(0.2)
        done.record(value["n"])

    first = start_consumer(topo, queue, handler, prefetch=5)
    publish(rabbitmq_url, topo, *[Message({"n": n}, "job.g", "0s") for n in range(30)])
    assert until(lambda: len(done.values) >= 3, 10)
    first.stop(timeout_s=5)  # in the middle of the stream
    assert 3 <= len(done.values) < 30
    second = start_consumer(topo, queue, handler, prefetch=20)
    assert until(lambda: len(set(done.values)) == 30, 30), "a message was lost in the stop"
    second.stop()
    assert first.stats.handled + second.stats.handled >= 30


def test_keys_are_forgotten_after_the_retention_period(make_topology, rabbitmq_url, start_consumer):
    from delayq import InMemoryStore

    topo = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    effects = Calls()
    consumer = start_consumer(
        topo,
        queue,
        effects.record,
        store=InMemoryStore(),
        handler_timeout="500ms",
        lease="1s",
        retention="2s",
        check_retention=False,  # dedup retention under test; nothing is cancelled here
    )
    again = Message({"order": 1}, "job.r", "0s", message_id="same")
    publish(rabbitmq_url, topo, again, again)
    assert until(lambda: consumer.stats.handled + consumer.stats.duplicates == 2, 10)
    assert (consumer.stats.handled, consumer.stats.duplicates) == (1, 1)
    time.sleep(3.5)  # past the retention, and a prune has run since
    publish(rabbitmq_url, topo, again)
    assert until(lambda: consumer.stats.handled == 2, 10), "the key was never pruned"
    assert len(effects.values) == 2


def test_a_deferral_says_whose_claim_holds_the_key(
    make_topology, rabbitmq_url, start_consumer, tmp_path
):
    """Issue 29: a busy key was "claimed by another consumer" also when this consumer held
    the claim for another copy. Two copies of `mine` at once (concurrency 2): the second is
    deferred as held here; `theirs` is claimed in the store by someone else."""
    from delayq.message.envelope import epoch_ms
    from delayq.stores.key_scope import KeyScope, scoped_key

    topo = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    store = SQLiteStore(tmp_path / "keys.db")
    store.claim(scoped_key("theirs", queue, KeyScope.QUEUE), lease_ms=600_000, now_ms=epoch_ms())
    retries: dict[str, str] = {}
    handling = threading.Event()
    finish = threading.Event()

    class Reasons:
        def settled(self, event: Any) -> None:
            if event.outcome == "retry":
                retries.setdefault(event.message_id, event.reason)

    def handler(value: Any) -> None:
        handling.set()
        finish.wait(20)  # still handling the first copy of `mine` when the second comes

    consumer = start_consumer(
        topo, queue, handler, store=store, prefetch=4, concurrency=2, observers=[Reasons()]
    )
    publish(rabbitmq_url, topo, Message({"n": 1}, "job.d", "0s", message_id="mine"))
    assert until(handling.is_set, 10)
    publish(
        rabbitmq_url,
        topo,
        Message({"n": 1}, "job.d", "0s", message_id="mine"),
        Message({"n": 2}, "job.d", "0s", message_id="theirs"),
    )
    try:
        assert until(lambda: {"mine", "theirs"} <= retries.keys(), 10), retries
    finally:
        finish.set()
    assert "being handled by this consumer right now" in retries["mine"], retries
    assert "another copy of this message (same message id)" in retries["mine"]
    assert "held elsewhere: another consumer" in retries["theirs"], retries
    consumer.stop()
    store.close()
