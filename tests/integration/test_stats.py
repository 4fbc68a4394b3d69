"""``delayq stats`` against real nodes: the management API's figures, and AMQP's."""

from __future__ import annotations

import json
import time
from typing import Any

import pika

from delayq import Publisher, Topology
from delayq.local.node import LocalNode
from delayq.sync import apply_topology
from tests.integration.ops import delayq, stall_1s_tier


def _fill(node: LocalNode, topology: Any) -> pika.BlockingConnection:
    """3 messages waiting in the 30s tier, 2 in the work queue (1 of them delivered and
    unacked to a consumer), 2 in the DLQ, 1 unrouted. Returns the consumer's connection."""
    ns = topology.namespace
    # The unrouted one's key is said to be bound outside the file (else it is refused).
    topology = Topology.model_validate({**topology.model_dump(), "external_bindings": ["nobody.#"]})
    with Publisher(node.url, topology) as publisher:
        for n in range(3):
            publisher.publish({"n": n}, "job.later", "20s")
        publisher.publish({"now": 1}, "job.now", "0s")
        publisher.publish({"now": 2}, "job.now", "0s")
        publisher.publish({"lost": 1}, "nobody.binds.this", "0s")
    connection = pika.BlockingConnection(pika.URLParameters(node.url))
    channel = connection.channel()
    for _ in range(2):
        channel.basic_publish("", f"{ns}.work.dlq", b"dead", pika.BasicProperties(delivery_mode=2))
    channel.basic_qos(prefetch_count=1)
    channel.basic_consume(f"{ns}.work", lambda *args: None)  # holds one message unacked
    connection.process_data_events(time_limit=0.5)
    return connection


def _stats_until(args: list[str], want: dict[str, dict[str, Any]], timeout_s: float = 20):
    """Run ``delayq stats --json`` until the queues show ``want`` (figures lag a little)."""
    deadline = time.monotonic() + timeout_s
    while True:
        run = delayq("stats", "--json", *args)
        assert run.returncode == 0, run.stdout + run.stderr
        data = json.loads(run.stdout)
        queues = {q["queue"]: q for q in data["queues"]}
        seen = {name: {k: queues[name].get(k) for k in fields} for name, fields in want.items()}
        if seen == want or time.monotonic() > deadline:
            assert seen == want
            return data, run


def test_stats_from_the_management_api(local_rabbitmq_management_node: LocalNode, node_topology):
    node = local_rabbitmq_management_node
    topology, path = node_topology(node, ("1s", "30s"))
    ns = topology.namespace
    apply_topology(topology, node.url)
    consumer = _fill(node, topology)
    assert node.management_url is not None
    args = ["--file", str(path), "--url", node.url, "--management-url", node.management_url]
    try:
        data, _ = _stats_until(
            args,
            {
                f"{ns}.tier.30s": {"depth": 3, "ready": 3, "unacked": 0, "consumers": 0},
                f"{ns}.tier.1s": {"depth": 0},
                f"{ns}.retry.30s": {"depth": 0},
                f"{ns}.work": {
                    "depth": 2,
                    "ready": 1,
                    "unacked": 1,
                    "consumers": 1,
                    "dlq_depth": 2,
                },
                f"{ns}.unrouted": {"depth": 1},
            },
        )
        assert data["source"].startswith("management API http://guest:***@127.0.0.1:")
        table = delayq("stats", *args)
    finally:
        consumer.close()
    assert table.returncode == 0
    line = next(x for x in table.stdout.splitlines() if x.startswith(f"{ns}.work "))
    assert line.split() == [f"{ns}.work", "destination", "2", "1", "1", "1", "2"]
    assert "guest:guest" not in table.stdout + table.stderr


def test_a_management_user_that_may_not_see_the_vhost_counts_nothing_missing(
    local_rabbitmq_management_node: LocalNode, node_topology
):
    """A --management-url whose user has the management tag but no permission on the
    vhost: RabbitMQ 4.3 answers 404 for each queue, which read as every queue missing
    and "run delayq topology apply" (outside tester); 3.10.8 refuses it. Named, it is an
    error saying so; the default URL's such user is left for AMQP."""
    import secrets
    import uuid

    from tests.integration.ops import delete_user, management

    node = local_rabbitmq_management_node
    topology, path = node_topology(node, ("1s",))
    apply_topology(topology, node.url)
    name, password = f"m-{uuid.uuid4().hex[:8]}", secrets.token_hex(8)
    management(node, "PUT", f"/users/{name}", {"password": password, "tags": "management"})
    try:
        api = f"http://{name}:{password}@127.0.0.1:{node.management_port}/"
        for extra in (["--management-url", api], ["--json", "--management-url", api]):
            run = delayq("stats", "--file", str(path), "--url", node.url, *extra)
            assert run.returncode == 1, run.stdout + run.stderr
            assert "cannot show vhost '/'" in run.stderr, run.stderr
            assert "do not exist" not in run.stderr and "Traceback" not in run.stderr
            assert password not in run.stdout + run.stderr
        verified = delayq("topology", "verify", "--file", str(path), "--url", node.url,
                          "--management-url", api, "--no-probe")  # fmt: skip
        assert "cannot show vhost '/'" in verified.stdout + verified.stderr, verified.stdout
        assert "missing" not in verified.stdout, verified.stdout
    finally:
        delete_user(node, name)


def test_stats_over_amqp_on_a_node_without_the_plugin(
    local_rabbitmq_node: LocalNode, node_topology
):
    node = local_rabbitmq_node
    topology, path = node_topology(node, ("1s", "30s"))
    ns = topology.namespace
    apply_topology(topology, node.url)
    consumer = _fill(node, topology)
    args = ["--file", str(path), "--url", node.url]
    try:
        data, _ = _stats_until(
            args,
            {
                f"{ns}.tier.30s": {"depth": 3, "ready": 3, "unacked": None, "consumers": 0},
                # AMQP counts only the ready message, not the one held unacked.
                f"{ns}.work": {
                    "depth": 1,
                    "ready": 1,
                    "unacked": None,
                    "consumers": 1,
                    "dlq_depth": 2,
                },
                f"{ns}.unrouted": {"depth": 1},
            },
        )
        assert data["source"].startswith("AMQP passive declares on amqp://guest:***@")
        table = delayq("stats", *args)
    finally:
        consumer.close()
    line = next(x for x in table.stdout.splitlines() if x.startswith(f"{ns}.work "))
    assert line.split() == [f"{ns}.work", "destination", "1", "1", "?", "1", "2"]
    assert "ready messages only" in table.stdout


def test_stats_of_an_unapplied_topology_say_what_is_missing(
    local_rabbitmq_node: LocalNode, node_topology
):
    node = local_rabbitmq_node
    topology, path = node_topology(node)
    run = delayq("stats", "--file", str(path), "--url", node.url)
    assert run.returncode == 1
    line = next(x for x in run.stdout.splitlines() if x.startswith(f"{topology.namespace}.work "))
    assert line.split()[2:] == ["missing", "missing"]
    assert "topology apply" in run.stderr


def test_stats_show_dead_letters_a_tier_cannot_forward(
    local_rabbitmq_management_node: LocalNode, node_topology
):
    """With its target exchange gone, a quorum tier keeps its expired messages as dead
    letters (at-least-once): neither ready nor unacked, and stats must say so."""
    node = local_rabbitmq_management_node
    topology, path = node_topology(node, ("1s", "30s"))
    ns = topology.namespace
    apply_topology(topology, node.url)
    stall_1s_tier(node, topology, 4)
    assert node.management_url is not None
    args = ["--file", str(path), "--url", node.url, "--management-url", node.management_url]
    try:
        _stats_until(
            args, {f"{ns}.tier.1s": {"depth": 0, "forwarding": 4}, f"{ns}.work": {"depth": 0}}
        )
        table = delayq("stats", *args)
        assert f"# {ns}.tier.1s holds 4 dead letters not yet forwarded" in table.stdout
        assert f"{ns}.tier.30s holds" not in table.stdout
    finally:
        apply_topology(topology, node.url)  # the ready exchange back: the letters move on


def test_stats_show_each_intake_and_what_its_dlq_holds(local_rabbitmq_node: LocalNode, tmp_path):
    """An intake's queue (messages waiting for a bridge) and its DLQ (what the bridge
    parked, or the broker dead-lettered) are rows of their own."""
    import uuid

    import yaml

    from delayq.sync import delete_topology

    node = local_rabbitmq_node
    ns = f"o{uuid.uuid4().hex[:10]}"
    topology = Topology(
        namespace=ns, ladder=["1s"],
        destinations=[{"queue": f"{ns}.work", "bindings": ["job.#"]}],
        intakes=[{"exchange": f"plugin-{ns}", "type": "topic"}],
    )  # fmt: skip
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
    apply_topology(topology, node.url)
    intake = topology.intakes[0]
    queue, dlq = intake.queue_name(ns), intake.dlq_name(ns)
    try:
        connection = pika.BlockingConnection(pika.URLParameters(node.url))
        channel = connection.channel()
        channel.confirm_delivery()
        for n in range(3):  # no bridge runs: they wait in the intake queue
            props = pika.BasicProperties(headers={"x-delay": 500}, message_id=f"i{n}")
            channel.basic_publish(f"plugin-{ns}", "job.a", b"{}", props, mandatory=True)
        channel.basic_publish("", dlq, b"parked", pika.BasicProperties(delivery_mode=2))
        connection.close()
        _stats_until(
            ["--file", str(path), "--url", node.url],
            {queue: {"role": "intake", "depth": 3, "consumers": 0, "dlq_depth": 1}},
        )
        table = delayq("stats", "--file", str(path), "--url", node.url)
        line = next(x for x in table.stdout.splitlines() if x.startswith(f"{queue} "))
        assert line.split() == [queue, "intake", "3", "3", "?", "0", "1"]
    finally:
        delete_topology(topology, node.url)
