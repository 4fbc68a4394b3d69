"""``delayq topology grant`` on a node whose users the test controls.

The grant is applied by the CLI; then a producer user publishes delayed
messages through both adapters and is refused everything else, and a consumer
user runs a consumer that applies the topology, retries and dead-letters.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pika
import pika.exceptions as pex
import pytest

from delayq import AccessRefused, FixedBackoff, Message, Reject
from delayq.localnode import RABBITMQ_BIN, LocalNode
from delayq.sync import Consumer, apply_topology
from delayq.urls import redact
from tests.integration.ops import delayq
from tests.waiting import wait_for


@dataclass
class User:
    name: str
    password: str
    url: str


@pytest.fixture
def make_user(local_rabbitmq_management_node: LocalNode) -> Iterator[Any]:
    """Users with random passwords on the management node; deleted afterwards."""
    node = local_rabbitmq_management_node
    made: list[str] = []

    def make(role: str) -> User:
        name = f"{role}-{uuid.uuid4().hex[:8]}"
        password = secrets.token_hex(12)
        node.ctl("add_user", name, password)
        made.append(name)
        return User(name, password, f"amqp://{name}:{password}@127.0.0.1:{node.port}/")

    yield make
    for name in made:
        node.ctl("delete_user", name, check=False)


def _grant(node: LocalNode, path: Any, *args: str) -> Any:
    env = {**os.environ, **node.env()}  # rabbitmqctl finds the node and its cookie
    return delayq(
        "topology", "grant", "--file", str(path), "--url", node.url, "--apply", *args, env=env
    )


def _permissions(node: LocalNode, user: str) -> list[str]:
    out = node.ctl("list_user_permissions", user, "--no-table-headers", "--quiet")
    return out.strip().split("\t")


def test_the_grant_lets_a_producer_publish_and_a_consumer_consume(
    local_rabbitmq_management_node: LocalNode, node_topology, make_user, driver_for, start_consumer
):
    node = local_rabbitmq_management_node
    topology, path = node_topology(node, ("1s", "2s"))
    producer, consumer = make_user("producer"), make_user("consumer")
    run = _grant(
        node, path, "--producer-user", producer.name, "--consumer-user", consumer.name,
        "--rabbitmqctl", str(RABBITMQ_BIN / "rabbitmqctl"),
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"set the permissions of {producer.name!r} on vhost '/' via rabbitmqctl" in run.stdout
    for user in (producer, consumer):
        assert user.password not in run.stdout + run.stderr
    assert _permissions(node, producer.name)[1:] == [
        "^$", f"^(?:{topology.namespace}\\.ready|{topology.namespace}\\.tier\\.[0-9hms]+)$", "^$"
    ]

    seen: list[Any] = []
    lock = threading.Lock()

    def handler(body: dict[str, Any]) -> None:
        with lock:
            seen.append(body)
            attempts = sum(1 for b in seen if b == body)
        if body.get("poison"):
            raise Reject("poison")
        if body.get("flaky") and attempts < 2:
            raise RuntimeError("fails once")

    # The consumer user applies the topology at start: nothing exists before.
    handle = start_consumer(
        topology, f"{topology.namespace}.work", handler, url=consumer.url,
        policy=FixedBackoff(delay="1s", max_attempts=3),
    )
    publisher = driver_for(producer.url)
    publisher.publish(topology, {"delayed": 1}, "job.a", "1500ms")
    publisher.publish(topology, {"now": 1}, "job.a", "0s")
    publisher.publish(topology, {"flaky": 1}, "job.a", "1s")
    publisher.publish(topology, {"poison": 1}, "job.a", "0s")
    publisher.publish_many(topology, [Message({"batch": n}, "job.b", "1s") for n in range(5)])

    stats = handle.stats  # the poison message's fate is its own: wait for all three counts
    wait_for(
        lambda: stats.handled >= 8 and stats.retried >= 1 and stats.dead_lettered >= 1,
        20,
        lambda: f"8 handled, 1 retried, 1 dead-lettered ({stats})",
    )
    handle.stop()
    assert handle.stats.handled == 8  # delayed, now, flaky (second try), 5 of the batch
    assert handle.stats.retried == 1  # the flaky one, through the retry tier
    assert handle.stats.dead_lettered == 1  # the poison one, through the default exchange
    admin = pika.BlockingConnection(pika.URLParameters(node.url))
    dlq = admin.channel().queue_declare(f"{topology.namespace}.work.dlq", passive=True)
    assert dlq.method.message_count == 1
    admin.close()


def test_the_producer_may_not_consume_get_or_declare(
    local_rabbitmq_management_node: LocalNode, node_topology, make_user
):
    node = local_rabbitmq_management_node
    topology, path = node_topology(node)
    apply_topology(topology, node.url)
    producer = make_user("producer")
    run = _grant(
        node, path, "--producer-user", producer.name,
        "--rabbitmqctl", str(RABBITMQ_BIN / "rabbitmqctl"),
    )
    assert run.returncode == 0, run.stderr
    queue = f"{topology.namespace}.work"

    connection = pika.BlockingConnection(pika.URLParameters(producer.url))
    with pytest.raises(pex.ChannelClosedByBroker) as refused:
        connection.channel().basic_get(queue)
    assert refused.value.reply_code == 403
    with pytest.raises(pex.ChannelClosedByBroker) as refused:
        connection.channel().basic_consume(queue, lambda *args: None)
    assert refused.value.reply_code == 403
    connection.close()

    listing = delayq("dlq", "list", queue, "--file", str(path), "--url", producer.url)
    assert listing.returncode == 1
    assert f"refused user {producer.name!r} access to queue '{queue}.dlq'" in listing.stderr
    assert producer.password not in listing.stdout + listing.stderr

    elsewhere = topology.with_namespace(f"x{topology.namespace}")
    # Refused at its first declare that needs a right (a check of an existing entity).
    with pytest.raises(AccessRefused, match=f"refused user {producer.name!r}"):
        apply_topology(elsewhere, producer.url)
    with pytest.raises(AccessRefused):
        apply_topology(topology, producer.url)  # not even its own namespace: no configure
    with pytest.raises(AccessRefused):
        Consumer(producer.url, topology, queue, lambda body: None).start()
    applied = delayq("topology", "apply", "--file", str(path), "--url", producer.url)
    assert applied.returncode == 1 and "ACCESS_REFUSED" in applied.stderr
    assert producer.password not in applied.stdout + applied.stderr


def test_the_consumer_may_not_declare_outside_its_namespace(
    local_rabbitmq_management_node: LocalNode, node_topology, make_user
):
    node = local_rabbitmq_management_node
    topology, path = node_topology(node)
    consumer = make_user("consumer")
    run = _grant(
        node, path, "--consumer-user", consumer.name,
        "--rabbitmqctl", str(RABBITMQ_BIN / "rabbitmqctl"),
    )
    assert run.returncode == 0, run.stderr
    assert apply_topology(topology, consumer.url).ok
    with pytest.raises(AccessRefused):
        apply_topology(topology.with_namespace(f"x{topology.namespace}"), consumer.url)


def test_the_grant_through_the_management_api(
    local_rabbitmq_management_node: LocalNode, node_topology, make_user
):
    node = local_rabbitmq_management_node
    topology, path = node_topology(node)
    producer, consumer = make_user("producer"), make_user("consumer")
    assert node.management_url is not None
    run = _grant(
        node, path, "--producer-user", producer.name, "--consumer-user", consumer.name,
        "--via", "management", "--management-url", node.management_url,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"via {redact(node.management_url)}" in run.stdout
    assert "guest:guest" not in run.stdout + run.stderr
    request = urllib.request.Request(
        f"http://127.0.0.1:{node.management_port}/api/permissions/%2F/{consumer.name}",
        headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="},  # guest:guest
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        granted = json.loads(response.read())
    assert _permissions(node, consumer.name)[1:] == [
        granted["configure"], granted["write"], granted["read"]
    ]
    assert granted["write"].startswith("^(?:amq\\.default|")
    assert apply_topology(topology, consumer.url).ok  # the consumer's grant works


@pytest.mark.parametrize("via", ["rabbitmqctl", "management"])
def test_a_grant_for_a_user_that_does_not_exist_fails_clearly(
    local_rabbitmq_management_node: LocalNode, node_topology, via
):
    node = local_rabbitmq_management_node
    _, path = node_topology(node)
    assert node.management_url is not None
    run = _grant(
        node, path, "--producer-user", "nobody-here", "--via", via,
        "--rabbitmqctl", str(RABBITMQ_BIN / "rabbitmqctl"),
        "--management-url", node.management_url,
    )
    assert run.returncode == 1
    assert "nobody-here" in run.stderr
    assert ("does not exist" in run.stderr) if via == "management" else ("failed" in run.stderr)


def test_a_producer_granted_another_namespace_is_refused_when_publishing(
    local_rabbitmq_management_node: LocalNode, node_topology, make_user, driver_for
):
    node = local_rabbitmq_management_node
    topology, _ = node_topology(node, ("1s", "2s"))
    apply_topology(topology, node.url)
    _, elsewhere = node_topology(node)  # the grant is for this other namespace
    producer = make_user("producer")
    run = _grant(
        node, elsewhere, "--producer-user", producer.name,
        "--rabbitmqctl", str(RABBITMQ_BIN / "rabbitmqctl"),
    )
    assert run.returncode == 0, run.stderr
    publisher = driver_for(producer.url)
    tier = f"exchange '{topology.namespace}.tier.1s'"
    with pytest.raises(AccessRefused, match=f"refused user '{producer.name}' access to {tier}"):
        publisher.publish(topology, {"n": 1}, "job.a", "1s")
    with pytest.raises(AccessRefused, match=f"access to exchange '{topology.namespace}.ready'"):
        publisher.publish(topology, {"n": 2}, "job.a", "0s")
    with pytest.raises(AccessRefused, match=tier):
        publisher.publish_many(topology, [Message({"n": n}, "job.b", "1s") for n in range(50)])
