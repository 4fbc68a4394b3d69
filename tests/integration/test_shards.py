"""Tier shards on a real broker: apply, deliver on time through every shard, and the
operator's views (plan, export, verify, stats) of a sharded namespace."""

from __future__ import annotations

import json
import time
from collections import Counter

import pika
import pytest

from delayq import Topology, TopologyNotApplied
from delayq.ops.management import ManagementAPI
from delayq.sync import Publisher, apply_topology, delete_topology, verify_topology
from delayq.topology.declarations import build_declarations
from delayq.topology.route import Router
from tests.integration.ops import delayq

SHARDS = 4


def sharded(make_topology, shards: int = SHARDS) -> Topology:
    return make_topology(shards=shards)  # deleted after the test, every shard included


def test_apply_declares_every_shard_and_messages_arrive_on_time(
    make_topology, rabbitmq_url, collect
):
    topology = sharded(make_topology)
    report = apply_topology(topology, rabbitmq_url)
    assert report.ok
    queue = topology.destinations[0].queue
    collector = collect(queue)
    with Publisher(rabbitmq_url, topology) as publisher:
        receipts = [
            publisher.publish({"n": i}, "job.run", "1s", message_id=f"order-{i}") for i in range(40)
        ]
    tier = topology.ladder.tiers[0]
    assert Counter(r.exchange for r in receipts).keys() == set(topology.tier_shards(tier))
    arrivals = collector.wait(40, timeout_s=30)
    assert sorted(a.message_id for a in arrivals) == sorted(r.message_id for r in receipts)
    by_id = {r.message_id: r for r in receipts}
    for arrival in arrivals:
        receipt = by_id[arrival.message_id]
        assert arrival.at_ms >= receipt.published_at_ms + receipt.delay_ms
        assert arrival.routing_key == "job.run"


def test_shards_1_on_quorum_queues_carry_the_leader_locator(make_topology, rabbitmq_url):
    topology = sharded(make_topology, shards=2)
    apply_topology(topology, rabbitmq_url)
    tier = topology.ladder.tiers[0]
    first, second = topology.tier_shards(tier)
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        channel = connection.channel()
        # Shard 1's arguments are shard 0's plus the locator, which the broker holds:
        # redeclared with shard 0's arguments alone, it is refused on that argument.
        arguments = next(
            d.arguments
            for d in build_declarations(topology)
            if d.name == first and d.kind == "queue"
        )
        assert "x-queue-leader-locator" not in arguments
        channel.queue_declare(first, durable=True, arguments=dict(arguments))
        with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="leader-locator"):
            channel.queue_declare(second, durable=True, arguments=dict(arguments))
    finally:
        connection.close()
    assert first == topology.tier_name(tier)


def test_a_changed_shard_count_is_refused_until_applied_and_both_counts_deliver(
    make_topology, rabbitmq_url, collect
):
    # Raising shards is additive (shard 0 is the old tier); until the new count is
    # applied a publisher of it refuses the namespace, and publishers of the old count
    # keep working, their messages delivered as before.
    four = sharded(make_topology)
    one = Topology.model_validate({**four.model_dump(), "shards": 1})
    apply_topology(one, rabbitmq_url)
    with pytest.raises(TopologyNotApplied), Publisher(rabbitmq_url, four) as publisher:
        publisher.publish("early", "job.run", "1s")
    apply_topology(four, rabbitmq_url)
    queue = one.destinations[0].queue
    collector = collect(queue)
    with Publisher(rabbitmq_url, one) as old, Publisher(rabbitmq_url, four) as new:
        for i in range(10):
            old.publish({"old": i}, "job.run", "1s", message_id=f"old-{i}")
            new.publish({"new": i}, "job.run", "1s", message_id=f"new-{i}")
    assert len(collector.wait(20, timeout_s=30)) == 20
    # Back to one shard: the extra shards are left to drain, nothing conflicts.
    assert apply_topology(one, rabbitmq_url).ok


def test_plan_export_verify_and_stats_show_the_shards(make_topology, rabbitmq_url, tmp_path):
    topology = sharded(make_topology, shards=2)
    apply_topology(topology, rabbitmq_url)
    path = tmp_path / "topology.yaml"
    path.write_text(json.dumps(topology.model_dump(mode="json")))  # JSON is YAML
    tier = topology.ladder.tiers[0]
    shard1 = topology.tier_shards(tier)[1]

    plan = delayq("topology", "plan", "--file", str(path))
    assert plan.returncode == 0, plan.stderr
    assert f"queue    {shard1} [tier]" in plan.stdout
    exported = delayq("topology", "export", "--file", str(path))
    assert shard1 in {q["name"] for q in json.loads(exported.stdout)["queues"]}

    checks = verify_topology(topology, rabbitmq_url, probe=False)
    assert all(c.status.value != "FAIL" for c in checks), checks

    router = Router(topology)
    ids = [f"id-{i}" for i in range(12)]
    with Publisher(rabbitmq_url, topology) as publisher:
        for message_id in ids:
            publisher.publish("later", "job.run", "8s", message_id=message_id)
    per_shard = Counter(router.shard(i) for i in ids)
    stats = delayq("stats", "--json", "--no-management", "--file", str(path), "--url", rabbitmq_url)
    assert stats.returncode == 0, stats.stderr
    rows = json.loads(stats.stdout)["queues"]
    eight = topology.tier_shards(topology.ladder.tiers[-1])
    total = next(r for r in rows if r["queue"] == eight[0] and r["role"] == "tier")
    assert total["shards"] == list(eight)
    shard_rows = [r for r in rows if r["role"] == "tier shard" and r["queue"] in eight]
    assert [r["ready"] for r in shard_rows] == [per_shard[0], per_shard[1]]
    assert total["ready"] == 12


def test_verify_reports_the_shards_a_lowered_count_left_behind(
    local_rabbitmq_management_node, node_topology
):
    node = local_rabbitmq_management_node
    base, _ = node_topology(node, ("1s", "30s"))
    four = Topology.model_validate({**base.model_dump(), "shards": 4})
    two = Topology.model_validate({**base.model_dump(), "shards": 2})
    apply_topology(four, node.url)
    try:
        _lowered(node, four, two)
    finally:
        delete_topology(four, node.url)  # every shard: the fixture deletes two's only


def _lowered(node, four: Topology, two: Topology) -> None:
    router = Router(four)
    ids = [f"id-{i}" for i in range(40)]
    with Publisher(node.url, four) as publisher:
        for message_id in ids:
            publisher.publish("later", "job.run", "30s", message_id=message_id)
    held = sum(1 for i in ids if router.shard(i) >= 2)
    assert held > 0
    apply_topology(two, node.url)
    api = ManagementAPI(node.management_url)
    tier = four.tier_name(four.ladder.tiers[-1])

    def leftovers():
        checks = verify_topology(two, node.url, management=api, probe=False)
        return next(c for c in checks if c.subject == "leftover shards")

    deadline = time.monotonic() + 20  # the API's message counts lag the queues a little
    check = leftovers()
    while f"holding {held:,} messages" not in check.detail and time.monotonic() < deadline:
        time.sleep(0.5)
        check = leftovers()
    assert check.status.value == "FAIL", check
    assert f"{tier}.s2" in check.detail and f"{tier}.s3" in check.detail
    assert f"{tier}.s1" not in check.detail
    assert f"holding {held:,} messages" in check.detail and "delete them once empty" in check.detail
    ok = verify_topology(four, node.url, management=api, probe=False)
    assert next(c for c in ok if c.subject == "leftover shards").status.value == "OK"
    without_api = verify_topology(two, node.url, probe=False)
    assert next(c for c in without_api if c.subject == "leftover shards").status.value == "SKIPPED"
