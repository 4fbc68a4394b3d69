"""Fault scenario: the node that leads the tier queues is lost while messages are parked.

Three local nodes form one cluster; every queue of the topology is a quorum
queue with a member on each node. A consumer (``AsyncConsumer`` with an SQLite
idempotency store) and a publisher run against the multi-host URL, both on the
node that leads the queues. That node is stopped while 10,000 messages wait in
the tiers (9,000 published before the stop, 1,000 during it), and stays down
to the end: there is no operator step.

What releases dead letters that stop moving after the leader is lost (RabbitMQ
3.10.8's at-least-once dead-letter worker can stop forwarding for good; see
docs/operations/deployment.md) is delayq's watchdog, the one ``delayq worker
--heal --heal-move-leaders`` runs: it reads the surviving nodes' management
APIs and gives a queue whose dead letters did not move for ``THRESHOLD`` a new
leader, with ``rabbitmqctl eval`` and the cluster's Erlang cookie.

Finally:

- every message was confirmed to the publisher (what a leaderless queue refused
  during the fault was re-sent with the same message id, as ``publish_many``'s
  caller is told to: :class:`~delayq.errors.PublishBatchError` names it);
- every message took effect exactly once (the handler writes one row per run
  into a table without a unique constraint, so a double effect would show);
- nothing is left in the tiers, retry tiers, work queue, DLQ or unrouted queue.

The figures (how many took effect while the node was down, what the watchdog
found and healed, how late) are printed and, when ``DELAYQ_RELIABILITY_OUT``
names a file, appended to it as one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import sqlite3
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from delayq import Message, PublishBatchError, Topology
from delayq.aio import AsyncConsumer, AsyncPublisher
from delayq.local.cluster import LocalCluster
from delayq.local.node import LocalNode
from delayq.ops.management import ManagementAPI
from delayq.ops.watchdog import HealOutcome, TransferLeadership, Watchdog
from delayq.stores.sqlite import SQLiteStore

pytestmark = [pytest.mark.faults, pytest.mark.cluster, pytest.mark.slow]

LADDER = ("2s", "5s", "20s")
"""The top tier is long enough that messages are still parked at the fault even when
publishing 9,000 takes 20 s on a loaded machine."""
BEFORE_THE_FAULT = 9_000
CHUNK = 500
DURING_THE_FAULT = 1_000
THRESHOLD = "15s"
"""The watchdog's: dead letters held this long without any going out are stalled."""
DEADLINE_S = 150.0
"""Longest wait, past the last due time, for every message to take effect (room for
the watchdog to find a stall, heal it, and for the released messages to be handled)."""
DRAIN_S = 60.0
"""Longest wait, once every message took effect, for the queues to hold nothing."""


class Effects:
    """What the handler did: one row per run, no unique constraint."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(str(path), isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("CREATE TABLE effects (key TEXT NOT NULL, at_ms INTEGER NOT NULL)")

    async def handle(self, body: dict[str, Any]) -> None:
        self.db.execute("INSERT INTO effects VALUES (?, ?)", (body["key"], time.time() * 1000))

    def distinct(self) -> int:
        return int(self.db.execute("SELECT COUNT(DISTINCT key) FROM effects").fetchone()[0])

    def counts(self) -> Counter[str]:
        return Counter(dict(self.db.execute("SELECT key, COUNT(*) FROM effects GROUP BY key")))

    def first_at_ms(self) -> dict[str, float]:
        return dict(self.db.execute("SELECT key, MIN(at_ms) FROM effects GROUP BY key"))


class Recorder(logging.Handler):
    """Keeps the time of the consumer's "consuming ... again" log line."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.resumed_at: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "consuming" in message and message.endswith("again"):
            self.resumed_at.append(record.created)


def _batch(first: int, count: int, rng: random.Random) -> list[Message]:
    messages = []
    for n in range(first, first + count):
        delay_ms = rng.randint(1_000, 20_000)  # across all three tiers
        key = f"k{n:05d}"
        messages.append(Message({"key": key}, "job.cluster", f"{delay_ms}ms", message_id=key))
    return messages


async def _publish_all(publisher: AsyncPublisher, batch: list[Message]) -> tuple[list[Any], int]:
    """``publish_many``, re-sending (same message ids) what the broker refused, as its
    caller is told to, on a fresh connection: a quorum queue that lost its leader
    nacks publishes, and on 3.10.8 a channel that got such nacks kept getting them.
    Returns the receipts and how many refusals there were."""
    receipts: dict[str, Any] = {}
    refused = 0
    for _ in range(5):
        try:
            for receipt in await publisher.publish_many(batch):
                receipts[receipt.message_id] = receipt
            return list(receipts.values()), refused
        except PublishBatchError as exc:
            for receipt in exc.receipts:
                if receipt is not None:
                    receipts[receipt.message_id] = receipt
            refused += len(exc.failures)
            batch = [batch[i] for i in sorted(exc.failures)]
            await publisher.aclose()  # the next round connects afresh
            await asyncio.sleep(1.0)
    raise AssertionError(f"{len(batch)} messages still refused after 5 rounds")


def _nodes_of(cluster: LocalCluster, name: str) -> list[LocalNode]:
    return [node for conn, node in cluster.connections() if conn == name]


async def _publisher_on(url: str, topology: Topology, cluster: LocalCluster, node: LocalNode):
    """An AsyncPublisher whose connection landed on ``node`` (clients start at a random
    host of the URL, so this takes a few tries)."""
    for _ in range(30):
        before = Counter(_nodes_of(cluster, "delayq-publisher"))
        publisher = AsyncPublisher(url, topology)
        await publisher.connect()
        mine = Counter(_nodes_of(cluster, "delayq-publisher")) - before
        if list(mine) == [node]:
            return publisher
        await publisher.aclose()
    raise AssertionError(f"no publisher connection landed on {node.name} in 30 tries")


async def _until(check, timeout_s: float, *, in_thread: bool, every_s: float = 0.5) -> bool:
    """Poll ``check`` until true; ``in_thread`` for slow checks (rabbitmqctl) that must not
    hold up the consumer running on this event loop."""
    deadline = time.monotonic() + timeout_s
    while True:
        if await asyncio.to_thread(check) if in_thread else check():
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(every_s)


def _report(figures: dict[str, Any]) -> None:
    print("\ncluster node loss:", json.dumps(figures))
    out = os.environ.get("DELAYQ_RELIABILITY_OUT")
    if out:
        with open(out, "a") as fh:
            fh.write(json.dumps(figures) + "\n")


def test_losing_the_node_that_leads_the_tiers_loses_and_doubles_nothing(
    local_rabbitmq_cluster: LocalCluster, tmp_path: Path, reliability: Any
) -> None:
    started = time.monotonic()
    figures = asyncio.run(_scenario(local_rabbitmq_cluster, tmp_path))
    _report(figures)
    reliability(
        "node loss in a 3-node cluster: the node leading every queue stopped with messages "
        "parked, consumer and publisher on it, and left down; no operator step, the "
        "watchdog heals stalled dead letters",
        messages=figures["messages"],
        faults=1,
        lost=figures["lost"],
        doubles=figures["double_effects"],
        recover_s=figures["consumer_back_after_s"],
        duration_s=round(time.monotonic() - started),
        notes=f"{figures['parked_at_fault']} parked at the stop; watchdog: "
        f"{figures['stalls_found']} stalled queues found, {figures['stalls_healed']} healed",
    )
    assert figures["lost"] == 0, figures
    assert figures["double_effects"] == 0, figures
    assert figures["dead_lettered"] == 0 and not figures["leftovers"], figures
    assert figures["parked_at_fault"] > 0
    assert not figures["heals_failed"], figures


def _watchdog(cluster: LocalCluster, topology: Topology) -> Watchdog:
    """The watchdog of ``delayq worker --heal --heal-move-leaders``, on every node's API."""
    return Watchdog(
        topology,
        [ManagementAPI(url, timeout_s=3.0) for url in cluster.management_urls],
        threshold=THRESHOLD,
        interval="2s",
        remedy=TransferLeadership(
            tuple(cluster.ctl_command()), erlang_cookie=cluster.cookie
        ),
    )


async def _scenario(cluster: LocalCluster, tmp_path: Path) -> dict[str, Any]:
    """Run the scenario; return its figures (asserting only what must hold to go on)."""
    url = cluster.url
    ns = f"t{uuid.uuid4().hex[:10]}"
    work = f"{ns}.work"
    topology = Topology(
        namespace=ns, ladder=list(LADDER), destinations=[{"queue": work, "bindings": ["job.#"]}]
    )
    total = BEFORE_THE_FAULT + DURING_THE_FAULT
    effects = Effects(tmp_path / "effects.db")
    recorder = Recorder()
    logging.getLogger("delayq.consumer").addHandler(recorder)
    logging.getLogger("delayq.consumer").setLevel(logging.INFO)
    consumer = AsyncConsumer(
        url,
        topology,
        work,
        effects.handle,
        store=SQLiteStore(tmp_path / "keys.db"),
        key=lambda body: body["key"],
        prefetch=200,
    )
    publisher: AsyncPublisher | None = None
    watchdog = _watchdog(cluster, topology)
    watching = threading.Event()
    watcher = threading.Thread(target=watchdog.run, args=(watching,), daemon=True)
    try:
        watcher.start()
        # The consumer declares the topology, so its node leads every queue.
        await consumer.start()
        queues = {q["name"]: q for q in cluster.queues() if q["name"].startswith(f"{ns}.")}
        all_nodes = sorted(node.name for node in cluster.nodes)
        # tiers, retry tiers (the fanout ones of earlier versions and the direct ones
        # consumers use now), work, dlq, unrouted
        assert len(queues) == len(LADDER) * 3 + 3
        for q in queues.values():
            assert q["type"] == "quorum" and sorted(q["members"]) == all_nodes, q
        leaders = {q["leader"] for q in queues.values()}
        assert len(leaders) == 1, leaders
        leader = cluster.node_named(leaders.pop())
        survivors = [n for n in cluster.nodes if n is not leader]
        assert _nodes_of(cluster, f"delayq-consumer {work}") == [leader]
        publisher = await _publisher_on(url, topology, cluster, leader)

        # Park 9,000, then lose the leader while publishing 1,000 more.
        rng = random.Random(20261122)
        started = time.monotonic()
        receipts, refused_before = [], 0
        for first in range(0, BEFORE_THE_FAULT, CHUNK):
            # In chunks, so that each message's receipt time is close to when it was sent
            # and the last chunks are still parked at the fault on a slow machine too.
            done, refused_now = await _publish_all(publisher, _batch(first, CHUNK, rng))
            receipts += done
            refused_before += refused_now
        publish_s = time.monotonic() - started
        fault_at = time.time()
        stopping = asyncio.create_task(asyncio.to_thread(cluster.stop_node, leader))
        during, refused = await _publish_all(
            publisher, _batch(BEFORE_THE_FAULT, DURING_THE_FAULT, rng)
        )
        receipts += during
        await stopping
        stop_s = time.time() - fault_at
        assert len(receipts) == total and refused_before == 0
        due_ms = {r.message_id: r.published_at_ms + r.tier_ms for r in receipts}
        parked_at_fault = sum(  # of the 9,000 published before the fault, not yet due
            1 for r in receipts[:BEFORE_THE_FAULT] if due_ms[r.message_id] > fault_at * 1000
        )

        # With the node down for good: what gets through, and where the clients went.
        last_due_s = max(due_ms.values()) / 1000
        await _until(
            lambda: effects.distinct() >= total,
            last_due_s + DEADLINE_S - time.time(),
            in_thread=False,
        )
        all_effects_after_s = time.time() - fault_at
        consumer_nodes = await asyncio.to_thread(_nodes_of, cluster, f"delayq-consumer {work}")
        publisher_nodes = await asyncio.to_thread(_nodes_of, cluster, "delayq-publisher")
        assert consumer.stats.reconnects >= 1 and recorder.resumed_at
        assert consumer_nodes and set(consumer_nodes) <= set(survivors), consumer_nodes
        assert publisher_nodes and set(publisher_nodes) <= set(survivors), publisher_nodes

        drain_started = time.time()
        await _until(
            lambda: all(q["messages"] == 0 for q in cluster.queues() if q["name"] in queues),
            timeout_s=DRAIN_S,
            in_thread=True,
        )
        drain_s = time.time() - drain_started
        await asyncio.sleep(3)  # room for late duplicates to show up as double effects
        counts = effects.counts()
        first_at = effects.first_at_ms()
        leftovers = {  # name: [messages, ready, unacknowledged]
            q["name"]: [q["messages"], q["messages_ready"], q["messages_unacknowledged"]]
            for q in await asyncio.to_thread(cluster.queues)
            if q["name"] in queues and q["messages"]
        }
        with sqlite3.connect(str(tmp_path / "keys.db")) as keys:
            open_claims = sorted(
                k
                for (k,) in keys.execute("SELECT key FROM delayq_idempotency WHERE done_at IS NULL")
            )
        late_s = sorted((first_at[k] - due_ms[k]) / 1000 for k in first_at)
        events = list(watchdog.events)
        return {
            "scenario": "cluster-node-loss",
            "nodes": len(cluster.nodes),
            "messages": total,
            "parked_at_fault": parked_at_fault,
            "faults": 1,
            "confirmed": len(receipts),
            "refused_then_resent": refused,
            "all_effects_after_s": round(all_effects_after_s, 2),
            "stalls_found": len(events),
            "stalls_healed": sum(e.outcome is HealOutcome.HEALED for e in events),
            "stalled_dead_letters": sum(e.stall.waiting for e in events),
            "stalls": [
                f"{e.stall.queue}: {e.stall.waiting} after {e.stall.stalled_s:.0f} s, "
                f"{e.outcome.value}"
                for e in events
            ],
            "heals_failed": [e.describe() for e in events if e.outcome is HealOutcome.FAILED],
            "watchdog_looks": watchdog.looks,
            "lost": total - len(counts),
            "open_claims": open_claims[:10],
            "double_effects": sum(c - 1 for c in counts.values() if c > 1),
            "duplicates_skipped": consumer.stats.duplicates,
            "deferred": consumer.stats.retried,
            "returned_to_queue": consumer.stats.returned,
            "dead_lettered": consumer.stats.dead_lettered,
            "leftovers": leftovers,
            "consumer_reconnects": consumer.stats.reconnects,
            "publish_9000_s": round(publish_s, 2),
            "node_stop_s": round(stop_s, 2),
            "consumer_back_after_s": round(recorder.resumed_at[0] - fault_at, 2),
            "late_s_median": round(late_s[len(late_s) // 2], 2) if late_s else None,
            "late_s_max": round(late_s[-1], 2) if late_s else None,
            "drain_s": round(drain_s, 2),
        }
    finally:
        watching.set()
        watcher.join(30)
        logging.getLogger("delayq.consumer").removeHandler(recorder)
        await consumer.stop(5)
        if publisher is not None:
            await publisher.aclose()
