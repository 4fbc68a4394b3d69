"""Cancel and reschedule at scale on a real broker: issue 15's "Done when".

* 10,000 messages over a 1s/2s/4s ladder, 5,000 of them (chosen at random) cancelled:
  some before they are published, some while parked in a tier, some while waiting in a
  retry tier after a failed first attempt. Exactly the other 5,000 are handled, once
  each; no cancelled one reaches a handler after its cancel returned; the consumer's
  ``cancelled`` count is 5,000; nothing is dead-lettered. Sync and async consumers.
* the same with the consumer in a process of its own, killed with SIGKILL mid-run and
  started again: "once" as in ``test_sigkill.py`` (a transactional handler writes its
  effect in the store's own transaction; the effects table has no unique key, so a
  double shows).
* 2,000 messages rescheduled, half earlier and half later: each handled once, by its
  new copy (its generation), never before the new due time, never at the old one; every
  old copy acked as ``cancelled``.
* a cancel while the handler runs is told ``in progress`` and changes nothing: the
  handler's effect stands, and a second cancel says ``already handled``.

See ``docs/concepts/cancel.md``.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from delayq import (
    CancelStatus,
    FixedBackoff,
    Message,
    Reschedule,
    Settled,
    SQLiteStore,
    Topology,
)
from delayq.aio import AsyncConsumer, AsyncPublisher
from delayq.message.cancel import CancelReceipt
from delayq.message.envelope import H_GENERATION
from delayq.stores.base import CANCELLED_GENERATION
from delayq.sync import Consumer, Publisher, apply_topology
from tests.faults.workload import depths
from tests.integration.conftest import AsyncConsumerHandle, ConsumerHandle, SyncConsumerHandle
from tests.integration.test_sigkill import Target, _kill_inside_a_handler
from tests.waiting import wait_for, wait_for_async

ROUTING_KEY = "job.scale"
MARKED = (CancelStatus.CANCELLED, CancelStatus.UNKNOWN, CancelStatus.ALREADY_CANCELLED)
"""What a cancel that took answers: no handler may start after it returned."""


class Record:
    """Every handler start (with its monotonic time) and success, and every settled
    delivery, by message id (the body's ``id`` is the message id)."""

    def __init__(self) -> None:
        self.starts: dict[str, list[float]] = {}
        self.successes: Counter[str] = Counter()
        self.outcomes: dict[str, list[str]] = {}
        self.events: dict[str, list[Settled]] = {}
        self.retried: list[str] = []
        self._lock = threading.Lock()

    def started(self, message_id: str) -> None:
        with self._lock:
            self.starts.setdefault(message_id, []).append(time.monotonic())

    def succeeded(self, message_id: str) -> None:
        with self._lock:
            self.successes[message_id] += 1

    def settled(self, event: Settled) -> None:  # a DeliveryObserver
        message_id = event.message_id or ""
        with self._lock:
            self.outcomes.setdefault(message_id, []).append(event.outcome)
            self.events.setdefault(message_id, []).append(event)
            if event.outcome == "retry":
                self.retried.append(message_id)

    def retried_now(self) -> list[str]:
        with self._lock:
            return list(self.retried)


def _start(
    kind: str, url: str, topology: Topology, handle: Callable[[Any], None], **options: Any
) -> ConsumerHandle:
    queue = topology.destinations[0].queue
    if kind == "sync":
        return SyncConsumerHandle(Consumer(url, topology, queue, handle, **options))

    async def handle_async(body: Any) -> None:
        handle(body)

    return AsyncConsumerHandle(AsyncConsumer(url, topology, queue, handle_async, **options))


def _cancel(
    publisher: Publisher,
    ids: Iterable[str],
    returned: dict[str, float],
    receipts: dict[str, CancelReceipt],
) -> None:
    """Cancel ``ids`` in one round trip; note when each receipt came back."""
    ids = list(ids)
    found = publisher.cancel_many(message_ids=ids, routing_key=ROUTING_KEY)
    now = time.monotonic()
    for message_id, receipt in zip(ids, found, strict=True):
        receipts[message_id] = receipt
        returned[message_id] = now


def _final(stats: Any) -> int:
    """Deliveries settled for good: handled, skipped (duplicate, cancelled), dead."""
    return int(stats.handled + stats.duplicates + stats.cancelled + stats.dead_lettered)


def _empty(url: str, topology: Topology) -> Callable[[], bool]:
    return lambda: not any(depths(url, topology).values())


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_ten_thousand_scheduled_half_cancelled_the_other_half_handled_once(
    kind, make_topology, rabbitmq_url, tmp_path
):
    total, count_cancelled, in_retry, retried_kept = 10_000, 5_000, 500, 500
    topology = make_topology(["1s", "2s", "4s"])
    apply_topology(topology, rabbitmq_url)
    rng = random.Random(15)
    ids = [f"m{n}" for n in range(total)]
    cancelled = rng.sample(ids, count_cancelled)
    kept = sorted(set(ids) - set(cancelled))
    # Of the cancelled: 500 fail their first attempt and are cancelled in the retry
    # tier, 1,500 are cancelled before they are published, the rest while parked.
    cancel_in_retry = set(cancelled[:in_retry])
    cancel_first = cancelled[in_retry : in_retry + 1_500]
    cancel_parked = cancelled[in_retry + 1_500 :]
    flaky = cancel_in_retry | set(rng.sample(kept, retried_kept))
    record = Record()
    failed: set[str] = set()
    lock = threading.Lock()

    def handle(body: Any) -> None:
        message_id = body["id"]
        record.started(message_id)
        with lock:
            first = message_id in flaky and message_id not in failed
            failed.add(message_id)
        if first:
            raise RuntimeError("the first attempt fails")
        record.succeeded(message_id)

    db = tmp_path / "store.db"
    consumer_store, publisher_store = SQLiteStore(db), SQLiteStore(db)  # two, as two hosts'
    consumer = _start(
        kind,
        rabbitmq_url,
        topology,
        handle,
        store=consumer_store,
        observers=[record],
        policy=FixedBackoff(delay="4s", max_attempts=5),
        prefetch=200,
    )
    returned: dict[str, float] = {}
    receipts: dict[str, CancelReceipt] = {}

    def message(message_id: str, delay: object) -> Message:
        return Message({"id": message_id}, ROUTING_KEY, delay, message_id=message_id)

    try:
        with Publisher(rabbitmq_url, topology, store=publisher_store) as publisher:
            _cancel(publisher, cancel_first, returned, receipts)  # not published yet
            for start in range(0, len(cancel_parked), 500):  # parked 4 s, cancelled at once
                chunk = cancel_parked[start : start + 500]
                publisher.publish_many([message(m, "4s") for m in chunk])
                _cancel(publisher, chunk, returned, receipts)
            rest = [m for m in ids if m not in flaky and m not in cancel_parked]
            publisher.publish_many([message(m, f"{rng.randint(0, 4000)}ms") for m in rest])
            publisher.publish_many([message(m, "0s") for m in sorted(flaky)])

            def cancel_the_retried() -> bool:  # each as soon as its retry is parked
                waiting = [m for m in record.retried_now() if m in cancel_in_retry]
                fresh = [m for m in waiting if m not in receipts]
                if fresh:
                    _cancel(publisher, fresh, returned, receipts)
                return len(waiting) == in_retry

            wait_for(cancel_the_retried, 60, lambda: f"{len(record.retried_now())} retried")
        stats = consumer.stats
        wait_for(  # every message settled for good, one way or another
            lambda: _final(stats) >= total,
            60,
            lambda: f"{len(kept)} handled and {count_cancelled} cancelled: {stats}",
        )
        wait_for(
            _empty(rabbitmq_url, topology),
            30,
            lambda: f"every queue empty: {depths(rabbitmq_url, topology)}",
        )
    finally:
        consumer.stop(10)
        consumer_store.close()
        publisher_store.close()
    unmarked = {m: r.status for m, r in receipts.items() if r.status not in MARKED}
    assert not unmarked, f"cancels that lost to a handler: {unmarked}"
    assert {receipts[m].status for m in cancel_first} == {CancelStatus.UNKNOWN}
    assert {receipts[m].status for m in cancel_parked} == {CancelStatus.UNKNOWN}
    assert set(record.successes) == set(kept), "handled != the messages not cancelled"
    assert set(record.successes.values()) == {1}, "a message was handled twice"
    late = {
        m: record.starts[m]
        for m in cancelled
        if any(t >= returned[m] for t in record.starts.get(m, []))
    }
    assert not late, f"handlers started after their cancel returned: {late}"
    first_attempts = {m for m in cancel_in_retry if len(record.starts.get(m, [])) == 1}
    assert first_attempts == cancel_in_retry  # each failed once, then was cancelled
    assert all(record.outcomes[m] == ["retry", "cancelled"] for m in cancel_in_retry)
    assert stats.handled == len(kept) and stats.cancelled == count_cancelled, stats
    assert stats.retried == len(flaky) and stats.duplicates == 0, stats
    assert stats.dead_lettered == 0, stats
    assert depths(rabbitmq_url, topology)[f"{topology.destinations[0].queue}.dlq"] == 0


# The same with the consumer killed with SIGKILL mid-run ---------------------------

KILLS = 3


def _rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db, timeout=30) as conn:
        return conn.execute(sql).fetchall()


def _starts(log: Path) -> dict[int, list[float]]:
    """When each handler began, by message number (the target's log)."""
    found: dict[int, list[float]] = {}
    for line in log.read_text().splitlines():
        stage, n, _, at = line.split()
        if stage == "start":
            found.setdefault(int(n), []).append(float(at))
    return found


def test_ten_thousand_half_cancelled_with_the_consumer_killed_mid_run(
    make_topology, rabbitmq_url, tmp_path
):
    """As above, the consumer (async) a process of its own killed with SIGKILL three
    times (each kill lands inside a handler) and started again; ``test_sigkill.py``
    kills both adapters. "Handled once" is the
    effect committed once (a transactional handler; see ``test_sigkill.py``)."""
    total, in_retry = 10_000, 500
    topology = make_topology(["1s", "2s", "4s"])
    rng = random.Random(16)
    numbers = list(range(total))
    cancelled = rng.sample(numbers, total // 2)
    kept = sorted(set(numbers) - set(cancelled))
    # The 500 cancelled in a retry tier fail every attempt: were a cancel lost in the
    # kills, they would end in the DLQ. 500 kept ones fail their first attempt only.
    cancel_in_retry = set(cancelled[:in_retry])
    cancel_first = cancelled[in_retry : in_retry + 1_500]
    cancel_parked = cancelled[in_retry + 1_500 :]
    fail_first = set(rng.sample(kept, 500))
    db, log = tmp_path / "app.db", tmp_path / "handlers.log"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE effects (n INTEGER, pid INTEGER)")  # no unique key
        conn.execute("CREATE TABLE failed (n INTEGER PRIMARY KEY)")
    topology_file = tmp_path / "topology.json"
    topology_file.write_text(topology.model_dump_json())
    target = Target(
        [
            "--url",
            rabbitmq_url,
            "--topology",
            str(topology_file),
            "--db",
            str(db),
            "--log",
            str(log),
            "--adapter",
            "async",
        ],
        tmp_path / "consumer.err",
        module="tests.integration.cancel_kill_target",
    )
    target.start()  # declares the topology
    returned: dict[int, float] = {}
    receipts: dict[int, CancelReceipt] = {}

    def cancel(publisher: Publisher, numbers: list[int]) -> None:
        found = publisher.cancel_many(message_ids=[f"k{n}" for n in numbers])
        now = time.time()
        for n, receipt in zip(numbers, found, strict=True):
            if receipt.status is not CancelStatus.IN_PROGRESS:  # else: again, later
                receipts[n], returned[n] = receipt, now

    def message(n: int, delay: object) -> Message:
        body: dict[str, Any] = {"n": n}
        if n in cancel_in_retry or n in fail_first:
            body["fail"] = "always" if n in cancel_in_retry else "first"
        return Message(body, ROUTING_KEY, delay, message_id=f"k{n}")

    def handled() -> int:
        return int(_rows(db, "SELECT COUNT(DISTINCT n) FROM effects")[0][0])

    store = SQLiteStore(db)
    kills = 0
    try:
        with Publisher(rabbitmq_url, topology, store=store) as publisher:
            cancel(publisher, cancel_first)
            for start in range(0, len(cancel_parked), 500):
                chunk = cancel_parked[start : start + 500]
                publisher.publish_many([message(n, "4s") for n in chunk])
                cancel(publisher, chunk)
            rest = [n for n in numbers if n not in cancel_in_retry and n not in cancel_parked]
            publisher.publish_many([message(n, f"{rng.randint(0, 4000)}ms") for n in rest])
            publisher.publish_many([message(n, "0s") for n in sorted(cancel_in_retry)])

            def step() -> bool:
                nonlocal kills
                failed = {n for (n,) in _rows(db, "SELECT n FROM failed")}
                fresh = sorted((failed & cancel_in_retry) - set(receipts))
                if fresh:
                    cancel(publisher, fresh)
                done = handled()
                if kills < KILLS and done >= len(kept) * (kills + 1) // (KILLS + 1):
                    _kill_inside_a_handler(target, log, "start")
                    target.start()
                    kills += 1
                return kills == KILLS and done == len(kept) and cancel_in_retry <= set(receipts)

            wait_for(
                step,
                90,
                lambda: f"{handled()} handled, {len(receipts)} cancelled, {kills} kills",
                interval_s=0.1,
            )
        wait_for(
            _empty(rabbitmq_url, topology),
            30,
            lambda: f"every queue empty: {depths(rabbitmq_url, topology)}",
            interval_s=0.2,
        )
    finally:
        target.stop()
        store.close()
    wait_for(
        _empty(rabbitmq_url, topology),
        10,  # nothing put back at the graceful stop
        lambda: f"every queue empty: {depths(rabbitmq_url, topology)}",
        interval_s=0.2,
    )
    effects = [n for (n,) in _rows(db, "SELECT n FROM effects")]
    doubles = len(effects) - len(set(effects))
    unmarked = {n: r.status for n, r in receipts.items() if r.status not in MARKED}
    assert not unmarked, f"cancels that lost to a handler: {unmarked}"
    assert set(receipts) == set(cancelled)
    assert {receipts[n].status for n in cancel_parked} == {CancelStatus.UNKNOWN}
    assert set(effects) == set(kept), "handled != the messages not cancelled"
    assert doubles == 0, "an effect committed twice"
    starts = _starts(log)
    late = {n: starts[n] for n in cancelled if any(t >= returned[n] for t in starts.get(n, []))}
    assert not late, f"handlers started after their cancel returned: {late}"
    assert all(starts.get(n) for n in cancel_in_retry)  # each failed, then was cancelled
    queue = topology.destinations[0].queue
    generations = dict(
        _rows(db, f"SELECT key, generation FROM delayq_idempotency WHERE key LIKE 'q:{queue}:%'")
    )
    marks = {n for n in cancelled if generations.get(f"q:{queue}:k{n}") == CANCELLED_GENERATION}
    assert marks == set(cancelled)
    assert len(target.pids) == KILLS + 1


# Reschedules ------------------------------------------------------------------------

SLACK_MS = 15_000
"""How late a rescheduled copy may be handled after its new due time: a loose bound
(a loaded machine), the point being never early and never at the old time."""


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_two_thousand_rescheduled_each_handled_once_at_its_new_time(
    kind, make_topology, rabbitmq_url, tmp_path
):
    """1,000 moved earlier (16 s to 2 s), 1,000 later (8 s to 16 s), 200 untouched."""
    topology = make_topology(["1s", "2s", "4s", "8s", "16s"])
    apply_topology(topology, rabbitmq_url)
    earlier = [f"e{n}" for n in range(1_000)]
    later = [f"l{n}" for n in range(1_000)]
    controls = [f"c{n}" for n in range(200)]
    record = Record()

    def handle(body: Any) -> None:
        record.started(body["id"])
        record.succeeded(body["id"])

    db = tmp_path / "store.db"
    consumer_store, publisher_store = SQLiteStore(db), SQLiteStore(db)
    consumer: ConsumerHandle | None = None
    old: dict[str, Any] = {}
    moved: dict[str, Any] = {}
    try:
        with Publisher(rabbitmq_url, topology, store=publisher_store) as publisher:
            publisher.publish_many(
                [Message({"id": m}, ROUTING_KEY, "2s", message_id=m) for m in controls]
            )
            # A chunk at a time, moved (one store round trip) right after it is published.
            # The later group is moved before the consumer starts, so however slow the
            # machine, no old copy of it can be handled first; the earlier group's old
            # copies are due 16 s after their publish, long after their move.
            for group, before, after in ((later, "8s", "16s"), (earlier, "16s", "2s")):
                for start in range(0, len(group), 100):
                    chunk = group[start : start + 100]
                    sent = publisher.publish_many(
                        [Message({"id": m}, ROUTING_KEY, before, message_id=m) for m in chunk]
                    )
                    old.update(zip(chunk, sent, strict=True))
                    found = publisher.reschedule_many(
                        [Reschedule({"id": m}, ROUTING_KEY, after, message_id=m) for m in chunk]
                    )
                    moved.update(zip(chunk, found, strict=True))
                if consumer is None:
                    consumer = _start(
                        kind,
                        rabbitmq_url,
                        topology,
                        handle,
                        store=consumer_store,
                        observers=[record],
                    )
        assert consumer is not None
        stats = consumer.stats
        wanted = len(earlier) + len(later) + len(controls)
        wait_for(  # every copy settled for good, one way or another
            lambda: _final(stats) >= wanted + len(moved),
            60,
            lambda: f"{wanted} handled and {len(moved)} old copies cancelled: {stats}",
        )
        wait_for(
            _empty(rabbitmq_url, topology),
            30,
            lambda: f"every queue empty: {depths(rabbitmq_url, topology)}",
        )
    finally:
        if consumer is not None:
            consumer.stop(10)
        consumer_store.close()
        publisher_store.close()
    assert {r.marks.status for r in moved.values()} == {CancelStatus.UNKNOWN}
    assert all(r.moved for r in moved.values())
    assert record.successes == Counter({m: 1 for m in earlier + later + controls})
    assert stats.handled == wanted and stats.cancelled == len(moved), stats
    assert stats.duplicates == 0 and stats.retried == 0 and stats.dead_lettered == 0, stats
    problems: dict[str, str] = {}
    for m, receipt in moved.items():
        (handled,) = [e for e in record.events[m] if e.outcome == "ack"]
        (skipped,) = [e for e in record.events[m] if e.outcome == "cancelled"]
        new = receipt.receipt
        new_due = new.published_at_ms + new.tier_ms
        old_due = old[m].published_at_ms + old[m].tier_ms
        if int(handled.delivery.headers.get(H_GENERATION, 0)) != receipt.generation:
            problems[m] = f"handled copy's generation {handled.delivery.headers}"
        elif handled.received_at_ms < new_due:
            problems[m] = f"handled {new_due - handled.received_at_ms} ms early"
        elif handled.received_at_ms > new_due + SLACK_MS:
            problems[m] = f"handled {handled.received_at_ms - new_due} ms late"
        elif m in earlier and handled.received_at_ms >= old_due:
            problems[m] = "handled at its old time, not its new (earlier) one"
        elif int(skipped.delivery.headers.get(H_GENERATION, 0)) != 0:
            problems[m] = f"the cancelled copy is not the old one: {skipped.delivery.headers}"
        elif skipped.received_at_ms < old_due:
            problems[m] = "the old copy arrived before its due time"
    assert not problems, f"{len(problems)} wrong: {dict(list(problems.items())[:10])}"
    for m in controls:
        assert record.outcomes[m] == ["ack"]
        assert H_GENERATION not in record.events[m][0].delivery.headers


# A cancel racing a running handler --------------------------------------------------


def test_a_cancel_while_the_handler_runs_is_told_in_progress_sync(
    make_topology, rabbitmq_url, tmp_path
):
    topology = make_topology(["1s"])
    apply_topology(topology, rabbitmq_url)
    db = tmp_path / "store.db"
    entered, release = threading.Event(), threading.Event()
    effects: list[str] = []

    def handle(body: Any) -> None:
        entered.set()
        assert release.wait(60), "never released"
        effects.append(body["id"])

    consumer_store, publisher_store = SQLiteStore(db), SQLiteStore(db)
    consumer = SyncConsumerHandle(
        Consumer(
            rabbitmq_url, topology, topology.destinations[0].queue, handle, store=consumer_store
        )
    )
    try:
        with Publisher(rabbitmq_url, topology, store=publisher_store) as publisher:
            publisher.publish({"id": "race"}, ROUTING_KEY, "0s", message_id="race")
            assert entered.wait(30), "the handler never ran"
            during = publisher.cancel(message_id="race")
            release.set()
            wait_for(
                lambda: consumer.stats.handled == 1,
                30,
                lambda: f"the message handled: {consumer.stats}",
            )
            after = publisher.cancel(message_id="race")
    finally:
        release.set()
        consumer.stop(10)
        consumer_store.close()
        publisher_store.close()
    assert during.status is CancelStatus.IN_PROGRESS and not during.cancelled, during
    assert after.status is CancelStatus.ALREADY_HANDLED and not after.cancelled, after
    assert effects == ["race"]
    assert consumer.stats.cancelled == 0 and consumer.stats.handled == 1
    assert _generation(db, topology, "race") == 0  # the lost cancel marked nothing


def test_a_cancel_while_the_handler_runs_is_told_in_progress_async(
    make_topology, rabbitmq_url, tmp_path
):
    topology = make_topology(["1s"])
    apply_topology(topology, rabbitmq_url)
    db = tmp_path / "store.db"

    async def scenario() -> tuple[CancelReceipt, CancelReceipt, list[str], Any]:
        entered, release = asyncio.Event(), asyncio.Event()
        effects: list[str] = []

        async def handle(body: Any) -> None:
            entered.set()
            await asyncio.wait_for(release.wait(), 60)
            effects.append(body["id"])

        consumer_store, publisher_store = SQLiteStore(db), SQLiteStore(db)
        consumer = AsyncConsumer(
            rabbitmq_url, topology, topology.destinations[0].queue, handle, store=consumer_store
        )
        await consumer.start()
        try:
            async with AsyncPublisher(rabbitmq_url, topology, store=publisher_store) as pub:
                await pub.publish({"id": "race"}, ROUTING_KEY, "0s", message_id="race")
                await asyncio.wait_for(entered.wait(), 30)
                during = await pub.cancel(message_id="race")
                release.set()
                await wait_for_async(
                    lambda: consumer.stats.handled == 1,
                    30,
                    lambda: f"the message handled: {consumer.stats}",
                )
                after = await pub.cancel(message_id="race")
        finally:
            release.set()
            await consumer.stop(10)
            consumer_store.close()
            publisher_store.close()
        return during, after, effects, consumer.stats

    during, after, effects, stats = asyncio.run(scenario())
    assert during.status is CancelStatus.IN_PROGRESS and not during.cancelled, during
    assert after.status is CancelStatus.ALREADY_HANDLED and not after.cancelled, after
    assert effects == ["race"]
    assert stats.cancelled == 0 and stats.handled == 1
    assert _generation(db, topology, "race") == 0  # the lost cancel marked nothing


def _generation(db: Path, topology: Topology, message_id: str) -> int:
    """The generation kept in the store for a message's key (its mark, if any)."""
    key = f"q:{topology.destinations[0].queue}:{message_id}"
    with sqlite3.connect(db) as conn:
        (generation,) = conn.execute(
            "SELECT generation FROM delayq_idempotency WHERE key = ?", (key,)
        ).fetchone()
    return int(generation or 0)
