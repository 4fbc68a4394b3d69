"""Consumers (both adapters) reopen a lost connection and go on: the broker closing all
connections while they work loses nothing, and a store keeps effects to one each."""

from __future__ import annotations

import threading
import time
from collections import Counter

from delayq import InMemoryStore, Message
from delayq.sync import Publisher


def test_a_consumer_reconnects_after_its_connection_is_closed_and_loses_nothing(
    local_rabbitmq_node, make_topology, start_consumer
):
    node = local_rabbitmq_node
    url = node.url
    topo = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    seen: Counter[int] = Counter()
    lock = threading.Lock()
    # The connections are closed while a handler runs: the 150th, 300th and 450th run each
    # holds the consumer's one handler slot until the test has closed every connection
    # (600 messages take about a second, less than one rabbitmqctl call: closing on a
    # timer, or with other handlers running on, closed an idle consumer).
    gates = {runs: (threading.Event(), threading.Event()) for runs in (150, 300, 450)}

    def handler(body: dict[str, int]) -> None:
        time.sleep(0.002)
        with lock:
            seen[body["n"]] += 1
            runs = sum(seen.values())
        if runs in gates:
            reached, closed = gates[runs]
            reached.set()
            closed.wait(30)

    consumer = start_consumer(
        topo, queue, handler, url=url, store=InMemoryStore(), prefetch=20, concurrency=1
    )
    total = 600
    with Publisher(url, topo) as pub:
        pub.publish_many(
            [Message({"n": n}, "job.r", "0s", message_id=f"r{n}") for n in range(total)]
        )
    for runs, (reached, closed) in gates.items():
        assert reached.wait(30), f"the consumer never reached its {runs}th handler run"
        node.ctl("close_all_connections", "delayq consumer reconnect test", check=False)
        closed.set()
    deadline = time.monotonic() + 60
    while len(seen) < total and time.monotonic() < deadline:
        time.sleep(0.05)
    consumer.stop()
    assert len(seen) == total, f"{total - len(seen)} messages were never handled"
    assert max(seen.values()) == 1, "a handler ran twice despite the store"
    # Each close came 150 runs after the last, more than a prefetch: a new connection
    # delivered the runs between them.
    assert consumer.stats.reconnects >= 3, consumer.stats


def test_a_handler_thread_cut_from_its_connection_still_records_its_key(
    local_rabbitmq_node, make_topology, start_consumer
):
    """A plain handler runs in a thread nobody can stop: when the connection is lost
    while it runs, its key must still be recorded once it ends, so the redelivery after
    the reconnect is a skipped duplicate, not a second effect."""
    node = local_rabbitmq_node
    topo = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    started = threading.Event()
    effects: list[str] = []

    def handler(body: dict[str, str]) -> None:
        started.set()
        time.sleep(1.5)
        effects.append(body["id"])

    consumer = start_consumer(
        topo, queue, handler, url=node.url, store=InMemoryStore(), key=lambda b: b["id"]
    )
    with Publisher(node.url, topo) as pub:
        pub.publish({"id": "cut-1"}, "job.cut", "0s", message_id="cut-1")
    assert started.wait(20)
    node.ctl("close_all_connections", "delayq cut handler test", check=False)
    deadline = time.monotonic() + 30
    while consumer.stats.duplicates + consumer.stats.handled < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(2.0)  # room for a second run of the handler, if there were one
    consumer.stop()
    assert effects == ["cut-1"], effects
    assert consumer.stats.reconnects >= 1
