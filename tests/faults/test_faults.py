"""Fault injection against real brokers: restart, connections cut every 2 s, a memory
alarm, a full tier, a consumer killed with SIGKILL, a handler slower than the broker's
consumer timeout. Each ends with: every confirmed message handled, none twice in effect,
nothing left anywhere the scenario did not put it. Figures go to the ``reliability``
report (docs/RELIABILITY.md)."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
from typing import Any

import pytest

from delayq import (
    FixedBackoff,
    InFlightLimit,
    Message,
    PublishBackpressure,
    PublishBatchError,
    PublishBlocked,
    PublishError,
    PublishRejected,
)
from delayq.aio import AsyncPublisher
from delayq.sync import Publisher, apply_topology
from tests.faults.workload import (
    ConsumerThread,
    Effects,
    SlowOnce,
    leftovers,
    make_topology,
    parked,
    random_messages,
)
from tests.integration.test_sigkill import KILLS, _run_with_kills

RESTART_MESSAGES = int(os.environ.get("DELAYQ_FAULT_RESTART_MESSAGES", "20000"))
CLOSE_SECONDS = float(os.environ.get("DELAYQ_FAULT_CLOSE_SECONDS", "60"))
SIGKILL_MESSAGES = int(os.environ.get("DELAYQ_FAULT_SIGKILL_MESSAGES", "20000"))


def _verdict(confirmed: set[int], counts: Any) -> tuple[int, int]:
    lost = len(confirmed - set(counts))
    doubles = sum(c - 1 for c in counts.values() if c > 1)
    return lost, doubles


def _claims(effects: Effects, ids: list[int]) -> list[tuple[Any, ...]]:
    """The idempotency rows of these message ids (which consumer state they are stuck in)."""
    with sqlite3.connect(effects.path, timeout=30) as db:
        return [
            row
            for n in ids
            for row in db.execute(
                "SELECT key, done_at, lease_until FROM delayq_idempotency WHERE key LIKE ?",
                (f"%m{n}",),
            )
        ]


def test_broker_restart_with_messages_parked(fault_node, reliability, tmp_path):
    node = fault_node()
    topo = make_topology(["5s", "10s", "20s"])
    effects = Effects(tmp_path / "app.db")
    consumer = ConsumerThread(node.url, topo, effects)
    started = time.monotonic()
    with Publisher(node.url, topo) as pub:
        receipts = pub.publish_many(random_messages(RESTART_MESSAGES, 20_000, min_ms=4_000))
    confirmed = {int(r.message_id[1:]) for r in receipts}
    waiting = parked(node.url, topo)
    node.stop()
    node.start()
    back = time.monotonic()
    before = sum(effects.counts().values())
    while sum(effects.counts().values()) == before and time.monotonic() - back < 60:
        time.sleep(0.1)
    recover_s = round(time.monotonic() - back, 1)
    counts = effects.wait_for(confirmed, timeout_s=180)
    consumer.stop()
    lost, doubles = _verdict(confirmed, counts)
    left = leftovers(node.url, topo)
    reliability(
        "broker restart (stop, start) with messages parked, consumer running",
        messages=len(confirmed), faults=1, lost=lost, doubles=doubles, recover_s=recover_s,
        duration_s=round(time.monotonic() - started), notes=f"{waiting} parked at the stop; "
        f"consumer reconnects: {consumer.stats.reconnects}",
    )
    assert len(confirmed) == RESTART_MESSAGES
    assert waiting > RESTART_MESSAGES // 2, "the restart should hit parked messages"
    assert lost == 0 and doubles == 0 and not left, (lost, doubles, left)
    assert consumer.stats.reconnects >= 1


def test_connections_closed_every_two_seconds(fault_node, reliability, tmp_path):
    node = fault_node()
    topo = make_topology(["1s", "2s", "4s"])
    apply_topology(topo, node.url)
    effects = Effects(tmp_path / "app.db")
    consumers = [ConsumerThread(node.url, topo, effects, kind) for kind in ("async", "sync")]
    confirmed: set[int] = set()
    unconfirmed = 0
    stop = threading.Event()
    closes = 0

    def publish_forever() -> None:
        nonlocal unconfirmed
        start = 0
        with Publisher(node.url, topo) as pub:
            while not stop.is_set():
                batch = random_messages(100, 4_000, start=start)
                start += len(batch)
                try:
                    receipts: list[Any] = pub.publish_many(batch)
                except PublishBatchError as exc:
                    receipts = exc.receipts
                    unconfirmed += len(exc.failures)
                except PublishError:
                    receipts, unconfirmed = [], unconfirmed + len(batch)
                confirmed.update(int(r.message_id[1:]) for r in receipts if r is not None)
                time.sleep(0.2)  # a few hundred a second: what the consumers keep up with

    publisher = threading.Thread(target=publish_forever, daemon=True)
    started = time.monotonic()
    publisher.start()
    while time.monotonic() - started < CLOSE_SECONDS:
        time.sleep(2)
        node.ctl("close_all_connections", "delayq fault test", check=False)
        closes += 1
    stop.set()
    publisher.join(60)
    last_close = time.monotonic()
    counts = effects.wait_for(confirmed, timeout_s=120)
    recover_s = round(time.monotonic() - last_close, 1)
    time.sleep(5)  # stragglers: redeliveries of what was handled but not acked
    counts = effects.counts()
    broker_view = node.ctl(
        "list_channels", "connection", "number", "consumer_count", "messages_unacknowledged"
    ) + node.ctl("list_queues", "name", "messages_ready", "messages_unacknowledged", "consumers")
    missing = sorted(confirmed - set(counts))
    broker_view += f"\nmissing ids: {missing[:20]}\nclaims: {_claims(effects, missing[:20])}"
    broker_view += "\nconsumer stats: " + "; ".join(f"{c.kind}: {c.stats}" for c in consumers)
    for consumer in consumers:
        consumer.stop()
    lost, doubles = _verdict(confirmed, counts)
    left = leftovers(node.url, topo)
    reconnects = sum(c.stats.reconnects for c in consumers)
    reliability(
        f"all connections closed every 2 s for {CLOSE_SECONDS:g} s (publisher, async and "
        "sync consumers running)",
        messages=len(confirmed), faults=closes, lost=lost, doubles=doubles,
        recover_s=recover_s, duration_s=round(time.monotonic() - started),
        notes=f"{unconfirmed} publishes reported unconfirmed to the caller; consumer "
        f"reconnects: {reconnects}",
    )
    if lost or doubles or left:
        print(broker_view)  # where the missing messages are, in full
    assert len(confirmed) > 1000
    assert lost == 0 and doubles == 0 and not left, (lost, doubles, left)
    assert reconnects >= closes // 2


def test_memory_alarm_blocks_publishers_within_the_bound(fault_node, reliability, tmp_path):
    node = fault_node()
    topo = make_topology(["1s", "2s"])
    effects = Effects(tmp_path / "app.db")
    consumer = ConsumerThread(node.url, topo, effects)
    started = time.monotonic()
    first = random_messages(100, 2_000)
    with Publisher(node.url, topo) as pub:
        pub.publish_many(first)
    node.ctl("set_vm_memory_high_watermark", "0.000001")
    time.sleep(3)  # the memory monitor notices
    blocked = random_messages(21, 2_000, start=100)
    bound_s = 3.0
    waited: list[float] = []
    sync_pub = Publisher(node.url, topo, blocked_timeout_s=bound_s)
    t0 = time.monotonic()
    with pytest.raises(PublishBlocked, match="blocking publishers"):
        sync_pub.send(sync_pub._factory.build_many([blocked[0]])[0])
    waited.append(time.monotonic() - t0)

    async def publish_async() -> None:
        async with AsyncPublisher(node.url, topo, confirm_timeout_s=bound_s) as pub:
            await pub.publish_many(blocked[1:])

    t0 = time.monotonic()
    with pytest.raises(PublishBatchError) as caught:
        asyncio.run(publish_async())
    waited.append(time.monotonic() - t0)
    assert all(isinstance(e, PublishBlocked) for e in caught.value.failures.values())
    node.ctl("set_vm_memory_high_watermark", "0.4")
    cleared = time.monotonic()
    with Publisher(node.url, topo) as pub:  # the caller re-sends what raised, same ids
        pub.publish_many(blocked)
    recover_s = round(time.monotonic() - cleared, 1)
    confirmed = set(range(121))
    counts = effects.wait_for(confirmed, timeout_s=60)
    time.sleep(3)
    counts = effects.counts()
    consumer.stop()
    sync_pub.close()
    lost, doubles = _verdict(confirmed, counts)
    left = leftovers(node.url, topo)
    reliability(
        "memory alarm while publishing (watermark set very low, then cleared)",
        messages=len(confirmed), faults=1, lost=lost, doubles=doubles, recover_s=recover_s,
        duration_s=round(time.monotonic() - started),
        notes="sync and async publishers raised PublishBlocked after "
        + " and ".join(f"{w:.1f} s" for w in waited) + f" (bound {bound_s:g} s); the same ids "
        "re-sent after the alarm were each handled once",
    )
    # The bound is a promise (it was once honoured at 5.0 s of 3 s): kept to within the
    # scheduling slack of a loaded two-core machine.
    assert all(w < bound_s + 2 for w in waited), waited
    assert lost == 0 and doubles == 0 and not left, (lost, doubles, left)


def _wait_for_alarm(node: Any, on: bool, timeout_s: float = 30.0) -> None:
    """Until the node reports a memory alarm (or none): a state, not a pause."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alarms = node.ctl("eval", "rabbit_alarm:get_alarms().")
        if ("memory" in alarms) == on:
            return
        time.sleep(0.2)
    raise AssertionError(f"the memory alarm did not {'rise' if on else 'clear'} in {timeout_s} s")


def test_a_blocked_broker_pushes_back_on_publishers_and_they_recover(
    fault_node, reliability, tmp_path
):
    """Confirms stop (a memory alarm): an asyncio publisher holds no more than its
    in-flight bound, a publish past it raises PublishBackpressure within the bound's
    wait with nothing sent, and what was in flight is confirmed once the alarm clears."""
    node = fault_node()
    topo = make_topology(["1s"])
    apply_topology(topo, node.url)
    effects = Effects(tmp_path / "app.db")
    consumer = ConsumerThread(node.url, topo, effects)
    started = time.monotonic()
    node.ctl("set_vm_memory_high_watermark", "0.000001")
    _wait_for_alarm(node, on=True)
    limit = InFlightLimit(messages=10, wait="1s")
    messages = random_messages(11, 1_000)
    refused_after: list[float] = []
    recovered_after: list[float] = []

    async def scenario() -> None:
        async with AsyncPublisher(node.url, topo, in_flight=limit, confirm_timeout_s=120) as pub:
            held = [asyncio.create_task(pub.publish_many([m])) for m in messages[:10]]
            while pub._admission.book.messages < 10:  # all ten sent, none confirmed
                await asyncio.sleep(0.05)
            t0 = time.monotonic()
            with pytest.raises(PublishBackpressure, match="did not free room within 1s"):
                await pub.publish_many(messages[10:])
            refused_after.append(time.monotonic() - t0)
            assert not any(task.done() for task in held)  # still waiting, not failed
            await asyncio.to_thread(node.ctl, "set_vm_memory_high_watermark", "0.4")
            cleared = time.monotonic()
            await asyncio.wait_for(asyncio.gather(*held), 60)  # confirmed once it clears
            recovered_after.append(round(time.monotonic() - cleared, 1))
            await pub.publish_many(messages[10:])  # the refused one, sent again: same id

    asyncio.run(scenario())
    recover_s = recovered_after[0]
    confirmed = set(range(11))
    effects.wait_for(confirmed, timeout_s=60)
    counts = effects.counts()
    consumer.stop()
    lost, doubles = _verdict(confirmed, counts)
    left = leftovers(node.url, topo)
    reliability(
        "confirms stopped by a memory alarm, asyncio publisher bounded at 10 in flight",
        messages=len(confirmed), faults=1, lost=lost, doubles=doubles, recover_s=recover_s,
        duration_s=round(time.monotonic() - started),
        notes=f"the 11th publish raised PublishBackpressure after {refused_after[0]:.1f} s "
        "(wait 1 s), nothing of it sent; the 10 in flight were confirmed after the alarm",
    )
    assert refused_after[0] < 1 + 2, refused_after
    assert lost == 0 and doubles == 0 and not left, (lost, doubles, left)


def test_full_tier_rejects_publishes_and_nothing_is_half_published(
    fault_node, reliability, tmp_path
):
    node = fault_node()
    topo = make_topology(["3s"], tier_max_length=50)
    apply_topology(topo, node.url)
    started = time.monotonic()
    accepted: set[int] = set()
    rejected: set[int] = set()
    with Publisher(node.url, topo) as pub:
        for n in range(80):  # one at a time: the queue's overflow state is exact
            try:
                pub.publish({"n": n}, "job.full", "3s", message_id=f"m{n}")
                accepted.add(n)
            except PublishRejected:
                rejected.add(n)
        more = [Message({"n": n}, "job.full", "3s", message_id=f"m{n}") for n in range(80, 90)]
        with pytest.raises(PublishBatchError) as caught:
            pub.publish_many(more)
    error = caught.value
    accepted |= {int(r.message_id[1:]) for r in error.receipts if r is not None}
    rejected |= {80 + i for i in error.failures}
    assert all(isinstance(e, PublishRejected) for e in error.failures.values())
    effects = Effects(tmp_path / "app.db")
    consumer = ConsumerThread(node.url, topo, effects)
    counts = effects.wait_for(accepted, timeout_s=30)
    time.sleep(5)  # a rejected message must never turn up
    counts = effects.counts()
    consumer.stop()
    lost, doubles = _verdict(accepted, counts)
    strays = set(counts) - accepted
    left = leftovers(node.url, topo)
    reliability(
        "full tier (x-max-length 50, reject-publish): 80 single publishes, then a batch of 10",
        messages=90, faults=1, lost=lost, doubles=doubles, recover_s="",
        duration_s=round(time.monotonic() - started),
        notes=f"{len(accepted)} confirmed and delivered, {len(rejected)} rejected with "
        "PublishRejected and never delivered (a quorum queue takes one past its limit)",
    )
    assert 50 <= len(accepted) <= 51 and len(accepted) + len(rejected) == 90
    assert lost == 0 and doubles == 0 and not strays and not left, (lost, doubles, strays, left)


def test_consumer_killed_with_sigkill_five_times(fault_node, reliability, tmp_path):
    node = fault_node()
    topo = make_topology(["1s"])
    started = time.monotonic()
    handled, doubles, interrupted, _ = _run_with_kills(
        topo, node.url, "async", tmp_path, "--sleep-ms", "0.3", "1.2",
        messages=SIGKILL_MESSAGES, drain_timeout_s=300,
    )
    reliability(
        f"consumer process killed with SIGKILL {KILLS} times mid-handler",
        messages=SIGKILL_MESSAGES, faults=KILLS, lost=SIGKILL_MESSAGES - handled,
        doubles=doubles, recover_s="", duration_s=round(time.monotonic() - started),
        notes=f"{interrupted} handlers cut mid-way (kills aimed just after a handler began "
        "or just after it wrote its effect); transactional SQLite handler",
    )
    assert handled == SIGKILL_MESSAGES and doubles == 0
    assert interrupted >= 1


def test_handler_slower_than_the_broker_consumer_timeout(fault_node, reliability, tmp_path):
    """delayq's handler timeout acts first: the slow delivery is retried and acked long
    before the broker's consumer_timeout, so the broker never closes the channel."""
    consumer_timeout_ms = 8_000
    node = fault_node(consumer_timeout=str(consumer_timeout_ms))
    topo = make_topology(["1s"])
    effects = Effects(tmp_path / "app.db")
    slow_once = SlowOnce(consumer_timeout_ms / 1000 + 4)  # past the broker's timeout

    consumer = ConsumerThread(
        node.url, topo, effects, handler=slow_once, handler_timeout="2s",
        policy=FixedBackoff(delay="1s", max_attempts=5),
    )
    started = time.monotonic()
    with Publisher(node.url, topo) as pub:
        pub.publish_many(
            [Message({"n": n}, "job.slow", "0s", message_id=f"m{n}") for n in range(5)]
        )
    counts = effects.wait_for(set(range(5)), timeout_s=30)
    handled_s = round(time.monotonic() - started, 1)
    time.sleep(consumer_timeout_ms / 1000 + 6)  # the first attempt's thread ends; look again
    counts = effects.counts()
    stats = consumer.stats
    consumer.stop()
    lost, doubles = _verdict(set(range(5)), counts)
    left = leftovers(node.url, topo)
    reliability(
        f"handler slower than the broker's consumer_timeout ({consumer_timeout_ms} ms), "
        "handler_timeout 2 s",
        messages=5, faults=1, lost=lost, doubles=doubles, recover_s=handled_s,
        duration_s=round(time.monotonic() - started),
        notes=f"retried after delayq's timeout ({stats.retried} retry), broker never closed "
        f"the channel (reconnects {stats.reconnects}); the overrunning attempt's late commit "
        f"was fenced off. RabbitMQ {node.version} evaluates consumer_timeout periodically",
    )
    assert lost == 0 and doubles == 0 and not left, (lost, doubles, left)
    assert stats.retried >= 1 and stats.reconnects == 0
