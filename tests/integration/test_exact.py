"""The exact strategy on a real broker: precision through the binary cascade, retries to
one queue alone, DLQ and unrouted as with tiers, and a restart mid-cascade."""

from __future__ import annotations

import json
import os
import random
import shlex
import threading
import time
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from delayq import FixedBackoff, Message, Receipt, Topology
from delayq.consume.delivery import H_DEAD_LETTER_REASON
from delayq.local.node import LocalNode
from delayq.message.envelope import H_ROUTING_KEY
from delayq.sync import Publisher, apply_topology, delete_topology
from delayq.topology.cascade import Kind, Strategy, decode_key
from delayq.topology.model import load_topology
from tests.integration.ops import delayq, rows
from tests.integration.test_grant import make_user  # noqa: F401 (a fixture)
from tests.waiting import wait_for

from .test_consumer import Calls, text, until
from .test_restart import DEAD_LETTER_RESEND_S

UNIT_MS = 200


def exact(make_topology: Any, levels: int = 5, unit_ms: int = UNIT_MS, **kwargs: Any) -> Topology:
    return make_topology(
        ["1s"], strategy="exact", exact={"unit": f"{unit_ms}ms", "levels": levels}, **kwargs
    )


def test_every_delay_from_1_to_20_units_arrives_on_time_with_its_routing_key(
    driver, make_topology, collect
):
    # 500 ms units (up to 10 s): "within one unit" must hold while the CI machine's two
    # cores also run a three-node cluster; at 200 ms one arrival in ~40 runs was 296 ms late
    unit_ms = 500
    topo = exact(make_topology, unit_ms=unit_ms)
    driver.apply(topo)
    inbox = collect(f"{topo.namespace}.work")
    batch = [
        Message({"n": n}, f"job.{n}.with.dots", timedelta(milliseconds=n * unit_ms))
        for n in range(1, 21)
    ]
    receipts = {r.message_id: r for r in driver.publish_many(topo, batch)}
    arrivals = inbox.wait(20, timeout_s=30)
    assert len(arrivals) == 20
    for arrival in arrivals:
        receipt = receipts[arrival.message_id]
        assert receipt.strategy is Strategy.EXACT
        assert receipt.hops == bin(receipt.delay_ms // unit_ms).count("1")
        waited = arrival.at_ms - receipt.published_at_ms
        assert waited >= receipt.delay_ms, f"{receipt.delay_ms} ms delay arrived early"
        assert waited <= receipt.delay_ms + unit_ms, (receipt.delay_ms, waited)
        key = decode_key(arrival.routing_key, topo.exact_levels)
        assert (key.kind, key.target) == (Kind.ROUTE, receipt.routing_key)
        assert text(arrival.headers[H_ROUTING_KEY]) == receipt.routing_key
    # the same topology's tiers stay available, per publish
    tiered = driver.publish(topo, b"t", "job.tiered", "1s", strategy="tiered")
    assert (tiered.strategy, tiered.exchange) == (Strategy.TIERED, f"{topo.namespace}.tier.1s")


def test_two_thousand_random_delays_are_never_early_and_late_by_at_most_a_unit_at_p99(
    rabbitmq_url, make_topology, collect
):
    """Never early, strictly; late against the due time (the delay rounded up to whole
    units) by at most one unit at p99 **beyond what the same run's immediate path shows**.

    What is measured is arrival at a raw consumer minus the receipt's publish time, so
    it holds the cascade's own lateness (each hop a quorum queue's dead-lettering) and
    everything around it: the publisher's batch, the broker's routing, the delivery, the
    collector thread being scheduled. On a quiet 2-core machine that is tens of ms; on a
    loaded CI machine (three test workers, their nodes, a JVM) it once reached 1,523 ms
    at p99, the same code, none of it the cascade's design. So zero-delay control
    messages, through the same topology, publisher kind, broker and collector, are sent
    every 50 ms from publishing to the last arrival: they take no hop (a delay of 0 goes
    straight to ``<ns>.ready``) and their latency is that run's noise. The bound is one
    unit plus the controls' p99. It still fails when the cascade is late by its own
    doing: a message waiting a level too many, or a unit more, is a unit late on top of
    whatever the controls saw at the same moments. Early is never excused: no control
    correction applies to it.
    """
    # 1 s, the default unit: each hop is a quorum queue's dead-lettering, tens of ms on
    # a quiet 2-core machine but up to ~600 ms at p99 while CI runs a three-node cluster
    # and two more nodes beside it (a 250 ms unit failed there once); 100 ms gave a p99
    # of 103 ms even on a quiet machine: the broker, not the cascade
    unit_ms = 1000
    topo = exact(make_topology, levels=4, unit_ms=unit_ms)  # up to 15 s
    apply_topology(topo, rabbitmq_url)
    inbox = collect(f"{topo.namespace}.work")
    rng = random.Random(6)
    batch = [
        Message(b"", f"job.{n}", timedelta(milliseconds=rng.randint(1, 15 * unit_ms)))
        for n in range(2000)
    ]
    receipts = {}
    controls: dict[str, Receipt] = {}
    stop = threading.Event()

    def send_controls() -> None:
        with Publisher(rabbitmq_url, topo) as pub:
            while not stop.is_set():
                receipt = pub.publish(b"", f"job.control.{len(controls)}", "0s")
                controls[receipt.message_id] = receipt
                stop.wait(0.05)

    sender = threading.Thread(target=send_controls, daemon=True)
    sender.start()
    try:
        with Publisher(rabbitmq_url, topo) as pub:
            # Small batches: a receipt's publish time is taken when its batch is built, so
            # one batch of 2,000 would count its own sending time as lateness.
            for start in range(0, len(batch), 25):
                chunk = pub.publish_many(batch[start : start + 25])
                receipts.update((r.message_id, r) for r in chunk)
        wait_for(
            lambda: sum(a.message_id in receipts for a in list(inbox.arrivals)) >= 2000,
            60,
            "the 2,000 delayed messages",
        )
    finally:
        stop.set()
        sender.join(30)
    wait_for(lambda: len(inbox.arrivals) >= 2000 + len(controls), 30, "the last controls")
    arrivals = [a for a in inbox.arrivals if a.message_id in receipts]
    assert Counter(a.message_id for a in arrivals).keys() == receipts.keys()
    assert len(arrivals) == 2000, "a delayed message arrived twice"
    early = [
        a
        for a in arrivals
        if a.at_ms - receipts[a.message_id].published_at_ms < receipts[a.message_id].delay_ms
    ]
    assert not early, f"{len(early)} messages arrived early"
    noise = sorted(
        a.at_ms - controls[a.message_id].published_at_ms
        for a in inbox.arrivals
        if a.message_id in controls
    )
    assert len(noise) == len(controls) >= 100  # sent all along the 15 s of deliveries
    noise_p99 = noise[int(len(noise) * 0.99)]
    late = sorted(
        a.at_ms - receipts[a.message_id].published_at_ms - receipts[a.message_id].tier_ms
        for a in arrivals
    )
    p99 = late[int(len(late) * 0.99)]
    assert p99 <= unit_ms + noise_p99, (
        f"p99 lateness {p99:.0f} ms is more than one unit ({unit_ms} ms) beyond the "
        f"immediate path's p99 in the same run ({noise_p99:.0f} ms)"
    )


def test_a_retry_goes_through_the_cascade_to_the_failing_queue_alone_then_to_its_dlq(
    make_topology, rabbitmq_url, collect, start_consumer
):
    ns = make_topology(["1s"]).namespace
    topo = Topology.from_mapping(
        {
            "namespace": ns,
            "ladder": ["1s"],
            "strategy": "exact",
            "exact": {"unit": f"{UNIT_MS}ms", "levels": 4},
            "destinations": [
                {"queue": f"{ns}.work", "bindings": ["order.created"]},
                {"queue": f"{ns}.audit", "bindings": ["order.created", "#"]},
            ],
        }
    )
    apply_topology(topo, rabbitmq_url)
    dlq = collect(f"{ns}.work.dlq")
    failing, audit = Calls(), Calls()

    def fail(value: Any) -> None:
        failing.record(value)
        raise RuntimeError("downstream is down")

    # 700 ms is 3.5 units: rounded up to 4 (800 ms), never early
    policy = FixedBackoff(delay="700ms", max_attempts=3)
    a = start_consumer(topo, f"{ns}.work", fail, policy=policy)
    b = start_consumer(topo, f"{ns}.audit", audit.record)
    with Publisher(rabbitmq_url, topo) as pub:
        pub.publish({"order": 9}, "order.created", "0s")
    assert until(lambda: a.stats.dead_lettered == 1, 15)
    time.sleep(1.0)
    a.stop()
    b.stop()
    delete_topology(topo, rabbitmq_url)
    assert len(failing.values) == 3
    gaps = [t2 - t1 for t1, t2 in zip(failing.times, failing.times[1:], strict=False)]
    assert all(0.8 <= gap <= 0.8 + 2 * UNIT_MS / 1000 for gap in gaps), gaps
    assert audit.values == [{"order": 9}], "the other queue saw a retry"
    [dead] = dlq.wait(1, timeout_s=5)
    assert text(dead.headers[H_DEAD_LETTER_REASON]) == "exhausted"
    assert text(dead.headers[H_ROUTING_KEY]) == "order.created"
    assert (a.stats.retried, a.stats.dead_lettered) == (2, 1)


def test_an_unrouted_due_message_is_parked_in_unrouted(driver, make_topology, collect):
    topo = exact(make_topology, external_bindings=["nobody.#"])  # said to be bound elsewhere
    driver.apply(topo)
    unrouted = collect(topo.unrouted)
    receipt = driver.publish(topo, b"lost", "nobody.listens.here", "600ms")
    [parked] = unrouted.wait(1, timeout_s=10)
    assert parked.message_id == receipt.message_id
    assert parked.at_ms - receipt.published_at_ms >= 600
    assert text(parked.headers[H_ROUTING_KEY]) == "nobody.listens.here"
    assert decode_key(parked.routing_key, topo.exact_levels).target == "nobody.listens.here"


@pytest.mark.timeout(DEAD_LETTER_RESEND_S + 180)
def test_messages_mid_cascade_survive_a_broker_restart(
    driver_for, local_rabbitmq_node: LocalNode, make_topology, collect
):
    url = local_rabbitmq_node.url
    unit_ms = 500
    topo = exact(make_topology, levels=5, unit_ms=unit_ms)  # up to 15.5 s
    driver = driver_for(url)
    driver.apply(topo)
    rng = random.Random(7)
    batch = [
        Message({"n": n}, f"job.r.{n}", timedelta(milliseconds=rng.randint(2_000, 15_500)))
        for n in range(300)
    ]
    receipts = {r.message_id: r for r in driver.publish_many(topo, batch)}
    driver.close()
    time.sleep(1.5)  # the longest are between levels now

    local_rabbitmq_node.restart()  # graceful stop and start, data kept

    inbox = collect(f"{topo.namespace}.work", url=url)
    # A level that expires messages while the node is still starting its queues may hand
    # them to a dead-letter worker that re-sends only after its confirm timeout (180 s on
    # 3.10.8; CI saw 161 of 300 wait for it once): late, never lost (test_restart.py).
    inbox.wait(300, timeout_s=DEAD_LETTER_RESEND_S + 60)
    arrivals = inbox.settle(0.5)
    counts = Counter(a.message_id for a in arrivals)
    assert set(counts) == set(receipts), f"{300 - len(counts)} messages lost in the restart"
    for arrival in arrivals:  # never early, even across a restart
        receipt = receipts[arrival.message_id]
        assert arrival.at_ms - receipt.published_at_ms >= receipt.delay_ms


def test_apply_verify_and_stats_cover_the_levels(
    local_rabbitmq_management_node: LocalNode, tmp_path: Path
):
    node = local_rabbitmq_management_node
    assert node.management_url is not None
    ns = f"x{uuid.uuid4().hex[:10]}"
    path = tmp_path / "exact.yaml"
    path.write_text(
        f"namespace: {ns}\nladder: [1s]\nstrategy: exact\n"
        "exact: {unit: 1s, levels: 4}\n"
        f"destinations: [{{queue: {ns}.work, bindings: [job.#]}}]\n"
    )
    topology = load_topology(path)
    common = ["--file", str(path), "--url", node.url]
    try:
        applied = delayq("topology", "apply", *common)
        assert applied.returncode == 0, applied.stdout + applied.stderr
        run = delayq("topology", "verify", *common, "--management-url", node.management_url)
        assert run.returncode == 0, run.stdout + run.stderr
        table = rows(run.stdout)
        assert all(status == "OK" for status, _ in table.values()), run.stdout
        for k in range(4):
            assert table[f"queue {ns}.level.{k}"][0] == "OK"
            assert table[f"exchange {ns}.level.{k}"][0] == "OK"
        assert table[f"exchange {ns}.delivery"][0] == "OK"
        # 4 of the tiered strategy + 2 per level (one to an exchange) + 2 on delivery
        assert table["bindings"][1] == "17 bindings present, no stray ones"
        with Publisher(node.url, topology) as pub:  # 15 units: 8 s in level 3, then 4, 2, 1
            pub.publish(b"x", "job.a", "15s")
        deadline = time.monotonic() + 10  # the management API's figures lag a few seconds
        while True:
            stats = delayq("stats", "--json", *common, "--management-url", node.management_url)
            assert stats.returncode == 0, stats.stdout + stats.stderr
            queues = {q["queue"]: q for q in json.loads(stats.stdout)["queues"]}
            depths = [queues[f"{ns}.level.{k}"]["depth"] for k in range(4)]
            if depths == [0, 0, 0, 1] or time.monotonic() > deadline:
                break
        assert depths == [0, 0, 0, 1]
        assert {queues[f"{ns}.level.{k}"]["role"] for k in range(4)} == {"level"}
    finally:
        delete_topology(topology, node.url)


def test_granted_users_apply_publish_and_retry_through_the_cascade(
    local_rabbitmq_management_node: LocalNode,
    tmp_path: Path,
    make_user,  # noqa: F811 (the fixture imported above)
    start_consumer,
):
    node = local_rabbitmq_management_node
    ns = f"g{uuid.uuid4().hex[:10]}"
    path = tmp_path / "exact.yaml"
    path.write_text(
        f"namespace: {ns}\nladder: [1s]\nstrategy: exact\nexact: {{unit: 200ms, levels: 4}}\n"
        f"destinations: [{{queue: {ns}.work, bindings: [job.#]}}]\n"
    )
    topology = load_topology(path)
    producer, consumer = make_user("producer"), make_user("consumer")
    admin = make_user("admin")
    env = {**os.environ, **node.env()}
    run = delayq(
        "topology", "grant", "--file", str(path), "--url", node.url, "--apply",
        "--producer-user", producer.name, "--consumer-user", consumer.name,
        "--admin-user", admin.name,
        "--rabbitmqctl", shlex.join(node.ctl_command()), env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    # The admin user applies the topology (exchange-to-exchange binds included).
    assert apply_topology(topology, admin.url).ok
    seen = Calls()

    def flaky(value: Any) -> None:
        seen.record(value)
        if len(seen.values) < 2:
            raise RuntimeError("fails once")

    try:
        # The consumer user checks the topology and retries through the cascade.
        handle = start_consumer(
            topology, f"{ns}.work", flaky, url=consumer.url,
            policy=FixedBackoff(delay="600ms", max_attempts=3),
        )  # fmt: skip
        with Publisher(producer.url, topology) as pub:
            receipt = pub.publish({"n": 1}, "job.a", "1s")
        assert receipt.exchange == f"{ns}.level.2"  # 5 units = 0b101
        assert until(lambda: handle.stats.handled == 1, 15)
        handle.stop()
        assert handle.stats.retried == 1
    finally:
        delete_topology(topology, node.url)
