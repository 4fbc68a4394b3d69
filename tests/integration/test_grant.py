"""``delayq topology grant`` on a node whose users the test controls.

The grants are applied by the CLI; then each role does its job with its own
user (the admin applies, the consumer consumes, retries and dead-letters, the
producer publishes), and is refused everything else, on a real broker. The
refusals include the two paths by which the consumer's earlier grant reached
other queues: deleting the namespace's tiers and ready exchange (configure),
and putting a message in another namespace's queue through the default
exchange (directly, or through a retry tier that dead-letters through it).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shlex
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pika
import pika.exceptions as pex
import pytest

from delayq import AccessRefused, FixedBackoff, Message, Reject, Retry, Topology, TopologyMissing
from delayq.aio import AsyncConsumer
from delayq.local.node import LocalNode
from delayq.sync import Consumer, apply_topology
from delayq.urls import redact
from tests.amqp import depth
from tests.integration.ops import add_user, delayq, delete_user, management, user_permissions
from tests.versions import access, passive_declares_checked
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
        add_user(node, name, password)
        made.append(name)
        return User(name, password, f"amqp://{name}:{password}@127.0.0.1:{node.port}/")

    yield make
    for name in made:
        delete_user(node, name)


def _grant(node: LocalNode, path: Any, *args: str) -> Any:
    env = {**os.environ, **node.env()}  # rabbitmqctl finds the node and its cookie
    return delayq(
        "topology", "grant", "--file", str(path), "--url", node.url, "--apply",
        "--rabbitmqctl", shlex.join(node.ctl_command()), *args, env=env,
    )


def _grant_by_api(node: LocalNode, path: Any, *args: str) -> Any:
    """``_grant`` through the management API: each rabbitmqctl call the default way makes
    is an Erlang VM of its own (two per user, some 8 s for three users on 4.0). The two
    ways set the same permissions (test_both_ways_of_granting_set_the_same_permissions)."""
    assert node.management_url is not None
    return _grant(node, path, "--via", "management", "--management-url", node.management_url,
                  *args)  # fmt: skip


@dataclass
class Granted:
    node: LocalNode
    topology: Topology
    path: Any
    producer: User
    consumer: User
    admin: User


@pytest.fixture
def granted(
    local_rabbitmq_management_node: LocalNode, node_topology: Any, make_user: Any
) -> Granted:
    """A topology and three users granted by the CLI; not applied yet."""
    node = local_rabbitmq_management_node
    topology, path = node_topology(node, ("1s", "30s"))
    users = [make_user(role) for role in ("producer", "consumer", "admin")]
    run = _grant_by_api(
        node, path, "--producer-user", users[0].name, "--consumer-user", users[1].name,
        "--admin-user", users[2].name,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    api = redact(str(node.management_url))
    for user in users:
        assert f"set the permissions of {user.name!r} on vhost '/' via {api}" in run.stdout
        assert user.password not in run.stdout + run.stderr
    return Granted(node, topology, path, *users)


def refused(action: Callable[[], Any]) -> bool:
    """Whether the broker refused ``action`` with ACCESS_REFUSED (403)."""
    try:
        action()
    except pex.ChannelClosedByBroker as exc:
        assert exc.reply_code == 403, exc
        return True
    return False


class Raw:
    """A raw pika connection as some user: one fresh confirmed channel per attempt."""

    def __init__(self, url: str) -> None:
        self.connection = pika.BlockingConnection(pika.URLParameters(url))

    def channel(self) -> Any:
        channel = self.connection.channel()
        channel.confirm_delivery()
        return channel

    def publish(self, exchange: str, key: str, headers: dict[str, Any] | None = None) -> None:
        props = pika.BasicProperties(message_id=f"inject-{uuid.uuid4().hex[:6]}", headers=headers)
        self.channel().basic_publish(exchange, key, b"injected", props, mandatory=True)

    def close(self) -> None:
        self.connection.close()


def test_each_role_does_its_job_with_its_own_grant(
    granted: Granted, driver_for: Any, start_consumer: Any
) -> None:
    g, topology = granted, granted.topology
    applied = delayq("topology", "apply", "--file", str(g.path), "--url", g.admin.url)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert g.admin.password not in applied.stdout + applied.stderr

    seen: list[Any] = []
    lock = threading.Lock()

    def handler(body: dict[str, Any]) -> None:
        with lock:
            seen.append(body)
            attempts = sum(1 for b in seen if b == body)
        if body.get("poison"):
            raise Reject("poison")
        if body.get("flaky") and attempts < 2:
            raise RuntimeError("fails once")  # retried through a retry tier
        if body.get("again") and attempts < 2:
            raise Retry("0s")  # retried at once, through <ns>.direct

    # The consumer may not declare: it checks the topology instead of applying it.
    handle = start_consumer(
        topology, f"{topology.namespace}.work", handler, url=g.consumer.url,
        policy=FixedBackoff(delay="1s", max_attempts=3),
    )
    publisher = driver_for(g.producer.url)
    publisher.publish(topology, {"delayed": 1}, "job.a", "1s")
    publisher.publish(topology, {"now": 1}, "job.a", "0s")
    publisher.publish(topology, {"flaky": 1}, "job.a", "1s")
    publisher.publish(topology, {"again": 1}, "job.a", "0s")
    publisher.publish(topology, {"poison": 1}, "job.a", "0s")
    publisher.publish_many(topology, [Message({"batch": n}, "job.b", "1s") for n in range(5)])

    stats = handle.stats  # the poison message's fate is its own: wait for all three counts
    wait_for(
        lambda: stats.handled >= 9 and stats.retried >= 2 and stats.dead_lettered >= 1,
        30,
        lambda: f"9 handled, 2 retried, 1 dead-lettered ({stats})",
    )
    handle.stop()
    assert handle.stats.handled == 9  # delayed, now, flaky, again, 5 of the batch
    assert handle.stats.retried == 2  # flaky through the retry tier, again at once
    assert handle.stats.dead_lettered == 1  # the poison one, through <ns>.direct
    assert depth(g.node.url, f"{topology.namespace}.work.dlq") == 1


def test_the_consumer_may_not_delete_declare_or_reach_another_namespace(
    granted: Granted, node_topology: Any
) -> None:
    g, ns = granted, granted.topology.namespace
    apply_topology(g.topology, g.admin.url)
    other, _ = node_topology(g.node)  # another namespace on the same vhost
    apply_topology(other, g.node.url)
    theirs = f"{other.namespace}.work"
    raw = Raw(g.consumer.url)
    try:
        # configure: nothing to delete or declare (issue 12: it could delete these).
        assert refused(lambda: raw.channel().queue_delete(f"{ns}.retry.30s"))
        assert refused(lambda: raw.channel().queue_delete(f"{ns}.retry.30s.direct"))
        assert refused(lambda: raw.channel().queue_delete(f"{ns}.tier.1s"))
        assert refused(lambda: raw.channel().queue_delete(f"{ns}.work"))
        assert refused(lambda: raw.channel().exchange_delete(f"{ns}.ready"))
        assert refused(lambda: raw.channel().queue_declare(f"{ns}.tier.1s", passive=False))
        # write: not the default exchange (issue 12: it injected into another namespace),
        # not the fanout retry tiers that dead-letter through it, not the tiers.
        assert refused(lambda: raw.publish("", theirs))
        assert refused(lambda: raw.publish(f"{ns}.retry.1s", theirs))
        assert refused(lambda: raw.publish(f"{ns}.tier.1s", "job.a"))
        assert refused(lambda: raw.publish(f"{ns}.ready", "job.a"))
        # Its direct exchanges route its own queue names only: another's is returned.
        for exchange in (f"{ns}.direct", f"{ns}.retry.1s.direct"):
            with pytest.raises(pex.UnroutableError):
                raw.publish(exchange, theirs)
        # A CC header survives dead-lettering; the retry queue dead-letters through
        # <ns>.direct, so the copy addressed to the other queue goes nowhere.
        raw.publish(f"{ns}.retry.1s.direct", f"{ns}.work", headers={"CC": [theirs]})
        # Dead-lettered back to its queue after the tier's second:
        wait_for(lambda: depth(g.node.url, f"{ns}.work") == 1, 20, f"a message in {ns}.work")
        assert depth(g.node.url, theirs) == 0
        # read: its queues only, not DLQs, not another namespace's queues.
        assert refused(lambda: raw.channel().basic_get(f"{ns}.work.dlq"))
        assert refused(lambda: raw.channel().basic_get(theirs))
    finally:
        raw.close()
    with pytest.raises(AccessRefused, match=f"refused user '{g.consumer.name}'"):
        apply_topology(g.topology, g.consumer.url)
    applied = delayq("topology", "apply", "--file", str(g.path), "--url", g.consumer.url)
    assert applied.returncode == 1 and "ACCESS_REFUSED" in applied.stderr
    assert g.consumer.password not in applied.stdout + applied.stderr


def test_the_producer_may_not_consume_declare_delete_or_address_queues(
    granted: Granted, node_topology: Any
) -> None:
    g, ns = granted, granted.topology.namespace
    apply_topology(g.topology, g.admin.url)
    other, _ = node_topology(g.node)
    apply_topology(other, g.node.url)
    queue = f"{ns}.work"
    raw = Raw(g.producer.url)
    try:
        assert refused(lambda: raw.channel().basic_get(queue))
        assert refused(lambda: raw.channel().basic_consume(queue, lambda *args: None))
        assert refused(lambda: raw.channel().queue_delete(f"{ns}.tier.1s"))
        assert refused(lambda: raw.channel().exchange_delete(f"{ns}.tier.1s"))
        assert refused(lambda: raw.publish("", queue))
        assert refused(lambda: raw.publish(f"{ns}.direct", queue))
        assert refused(lambda: raw.publish(f"{ns}.retry.1s.direct", queue))
        assert refused(lambda: raw.publish(f"{other.namespace}.tier.1s", "job.a"))
        assert refused(lambda: raw.publish(f"{other.namespace}.ready", "job.a"))
    finally:
        raw.close()

    listing = delayq("dlq", "list", queue, "--file", str(g.path), "--url", g.producer.url)
    assert listing.returncode == 1
    # refused the read (a basic.get); on 4.2.6+ already the passive declare that counts it
    checked = passive_declares_checked(g.node.version)
    read = access(g.node.version, "configure" if checked else "read")
    assert f"refused user {g.producer.name!r} {read} to queue '{queue}.dlq'" in listing.stderr
    assert g.producer.password not in listing.stdout + listing.stderr
    # Refused at its first declare that needs a right (a check of an existing entity).
    with pytest.raises(AccessRefused, match=f"refused user {g.producer.name!r}"):
        apply_topology(other, g.producer.url)
    with pytest.raises(AccessRefused):
        apply_topology(g.topology, g.producer.url)  # not even its own namespace
    applied = delayq("topology", "apply", "--file", str(g.path), "--url", g.producer.url)
    assert applied.returncode == 1 and "ACCESS_REFUSED" in applied.stderr
    assert g.producer.password not in applied.stdout + applied.stderr


def run_consumer(kind: str, url: str, topology: Topology, queue: str) -> None:
    """Run a consumer of ``kind`` until it fails (a test of refusals: it must)."""
    if kind == "sync":
        Consumer(url, topology, queue, print).run(install_signal_handlers=False)
        return

    async def run() -> None:
        await AsyncConsumer(url, topology, queue, print).run(install_signal_handlers=False)

    asyncio.run(asyncio.wait_for(run(), 60))


def test_a_user_that_may_not_read_its_queue_cannot_run_a_consumer(
    granted: Granted, driver_kind: str
) -> None:
    """Refused the consume, a consumer stops with AccessRefused instead of reconnecting
    for ever."""
    g = granted
    apply_topology(g.topology, g.admin.url)
    queue = f"{g.topology.namespace}.work"
    with pytest.raises(AccessRefused, match=f"refused user '{g.producer.name}'"):
        run_consumer(driver_kind, g.producer.url, g.topology, queue)


def test_the_admin_applies_its_namespace_and_no_other(
    granted: Granted, node_topology: Any
) -> None:
    g = granted
    report = apply_topology(g.topology, g.admin.url)
    assert report.ok
    assert apply_topology(g.topology, g.admin.url).ok  # twice: nothing changes
    # and verifies it, probe included (its queue and inbox <ns>.verify.<hex>[.in])
    verified = delayq("topology", "verify", "-f", str(g.path), "--url", g.admin.url, "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    probe = [c for c in json.loads(verified.stdout)["checks"] if "probe" in c["subject"]]
    assert [c["status"] for c in probe] == ["OK"], probe
    other, _ = node_topology(g.node)
    with pytest.raises(AccessRefused):
        apply_topology(other, g.admin.url)


def test_both_ways_of_granting_set_the_same_permissions(
    local_rabbitmq_management_node: LocalNode, node_topology: Any, make_user: Any
) -> None:
    """The same roles granted through rabbitmqctl (the default) and through the management
    API end with the same three patterns each, and the grants work."""
    node = local_rabbitmq_management_node
    topology, path = node_topology(node)
    by_ctl = {role: make_user(role) for role in ("producer", "consumer", "admin")}
    by_api = {role: make_user(role) for role in ("producer", "consumer", "admin")}

    def options(users: dict[str, User]) -> list[str]:
        return [arg for role, user in users.items() for arg in (f"--{role}-user", user.name)]

    ctl_run = _grant(node, path, *options(by_ctl))
    assert ctl_run.returncode == 0, ctl_run.stdout + ctl_run.stderr
    assert ctl_run.stdout.count("via rabbitmqctl") == 3, ctl_run.stdout
    api_run = _grant_by_api(node, path, *options(by_api))
    assert api_run.returncode == 0, api_run.stdout + api_run.stderr
    assert node.management_url is not None
    assert api_run.stdout.count(f"via {redact(node.management_url)}") == 3, api_run.stdout
    assert "guest:guest" not in ctl_run.stdout + ctl_run.stderr + api_run.stdout + api_run.stderr
    for role in by_ctl:
        assert user_permissions(node, by_ctl[role].name) == user_permissions(
            node, by_api[role].name
        ), role
    consumer = management(node, "GET", f"/permissions/%2F/{by_ctl['consumer'].name}")
    assert consumer["configure"] == "^$" and "amq" not in consumer["write"]
    assert apply_topology(topology, by_ctl["admin"].url).ok  # the admin's grant works


@pytest.mark.parametrize("via", ["rabbitmqctl", "management"])
def test_a_grant_for_a_user_that_does_not_exist_fails_clearly(
    local_rabbitmq_management_node: LocalNode, node_topology: Any, via: str
) -> None:
    node = local_rabbitmq_management_node
    _, path = node_topology(node)
    assert node.management_url is not None
    run = _grant(
        node, path, "--admin-user", "nobody-here", "--via", via,
        "--management-url", node.management_url,
    )
    assert run.returncode == 1
    assert "nobody-here" in run.stderr
    assert ("does not exist" in run.stderr) if via == "management" else ("failed" in run.stderr)


def test_a_producer_granted_another_namespace_is_refused_when_publishing(
    local_rabbitmq_management_node: LocalNode, node_topology: Any, make_user: Any, driver_for: Any
) -> None:
    node = local_rabbitmq_management_node
    topology, _ = node_topology(node, ("1s", "2s"))
    apply_topology(topology, node.url)
    _, elsewhere = node_topology(node)  # the grant is for this other namespace
    producer = make_user("producer")
    run = _grant_by_api(node, elsewhere, "--producer-user", producer.name)
    assert run.returncode == 0, run.stderr
    publisher = driver_for(producer.url)
    tier = f"exchange '{topology.namespace}.tier.1s'"
    write = access(node.version, "write")
    ready = f"exchange '{topology.namespace}.ready'"
    if passive_declares_checked(node.version):
        # refused at the publisher's first step, the check of the apply marker
        tier = ready = rf"exchange '{topology.namespace}\.applied\.[0-9a-f]+'"
        write = access(node.version, "configure")
    with pytest.raises(AccessRefused, match=f"refused user '{producer.name}' {write} to {tier}"):
        publisher.publish(topology, {"n": 1}, "job.a", "1s")
    with pytest.raises(AccessRefused, match=f"access to {ready}"):
        publisher.publish(topology, {"n": 2}, "job.a", "0s")
    with pytest.raises(AccessRefused, match=tier):
        publisher.publish_many(topology, [Message({"n": n}, "job.b", "1s") for n in range(50)])


def test_a_consumer_refused_configure_on_a_topology_never_applied_says_what_to_do(
    granted: Granted, driver_kind: str
) -> None:
    g = granted
    queue = f"{g.topology.namespace}.work"
    with pytest.raises(TopologyMissing, match="topology apply"):
        run_consumer(driver_kind, g.consumer.url, g.topology, queue)


@pytest.mark.parametrize("kind", ["direct", "headers"])
def test_an_intake_runs_under_the_grant_plugin_publishers_and_bridge_as_the_producer(
    local_rabbitmq_management_node: LocalNode,
    make_user: Any,
    tmp_path: Any,
    collect: Any,
    kind: str,
) -> None:
    """With intakes the admin applies them, plugin-style publishers publish to them as the
    producer user, and ``delayq bridge`` runs as that user: nothing more is granted. A
    headers intake's namespace adds its headers exchange to the admin's grant alone."""
    import yaml

    from delayq.sync.bridge import Bridge

    node = local_rabbitmq_management_node
    ns = f"o{uuid.uuid4().hex[:10]}"
    bound: dict[str, Any] = {"bindings": ["job.a"]}
    if kind == "headers":
        bound = {"headers": [{"tenant": "acme"}]}
    topology = Topology(
        namespace=ns, ladder=["1s"],
        destinations=[{"queue": f"{ns}x.work", **bound}],
        intakes=[{"exchange": f"plugin-{ns}", "type": kind}],
    )  # fmt: skip
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
    users = [make_user(role) for role in ("producer", "consumer", "admin")]
    run = _grant_by_api(node, path, "--producer-user", users[0].name, "--consumer-user",
                        users[1].name, "--admin-user", users[2].name)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    applied = delayq("topology", "apply", "--file", str(path), "--url", users[2].url)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    arrived = collect(f"{ns}x.work", url=node.url)
    bridge = Bridge(users[0].url, topology)
    thread = threading.Thread(target=lambda: bridge.run(install_signal_handlers=False))
    thread.start()
    try:
        wait_for(bridge.started.is_set, 30, lambda: "the bridge up as the producer")
        raw = Raw(users[0].url)
        try:
            raw.publish(f"plugin-{ns}", "job.a", {"x-delay": 500, "tenant": "acme"})
            raw.publish(f"plugin-{ns}", "job.a", {"x-delay": "soon"})  # parked
            # The producer still may not consume a destination queue.
            assert refused(lambda: raw.channel().basic_get(f"{ns}x.work"))
        finally:
            raw.close()
        [arrival] = arrived.wait(1, 30)
        assert arrival.routing_key == "job.a"
        wait_for(lambda: bridge.stats.parked == 1, 30, lambda: "the bad one parked")
        # The bridge's user checks the migration: it may not declare the entities, so
        # their arguments are not compared (no false "refused" problem: 41 on 4.3 once).
        check = delayq("migrate", "check", "-f", str(path), "--url", users[0].url, "--json")
        assert check.returncode == 0, check.stdout + check.stderr
        assert json.loads(check.stdout)["problems"] == []
        said = delayq("topology", "verify", "-f", str(path), "--url", users[0].url,
                      "--no-probe", "--json")  # fmt: skip
        skipped = [c for c in json.loads(said.stdout)["checks"] if c["status"] == "SKIPPED"]
        assert any("arguments not compared" in c["detail"] for c in skipped), said.stdout
    finally:
        bridge.request_stop()
        thread.join(30)
        from delayq.sync import delete_topology

        delete_topology(topology, node.url)


def test_a_bridge_user_runs_the_bridge_and_the_producer_may_not_reach_the_queues(
    local_rabbitmq_management_node: LocalNode, make_user: Any, tmp_path: Any, collect: Any
) -> None:
    """With --bridge-user the bridge's rights leave the producer: it publishes to the
    intake and the tiers only (not <ns>.direct, which reaches every queue of the topology
    by name, nor the intake queue); the bridge user schedules and parks, and may not
    publish to the intake exchange."""
    import yaml

    from delayq.sync import delete_topology
    from delayq.sync.bridge import Bridge
    from tests.integration.intake_support import Running, one_intake

    node = local_rabbitmq_management_node
    ns = f"o{uuid.uuid4().hex[:10]}"
    topology = one_intake(ns)
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
    producer, bridge_user, admin = (make_user(r) for r in ("producer", "bridge", "admin"))
    run = _grant_by_api(node, path, "--producer-user", producer.name, "--bridge-user",
                        bridge_user.name, "--admin-user", admin.name)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"# bridge {bridge_user.name!r}" in run.stdout
    applied = delayq("topology", "apply", "--file", str(path), "--url", admin.url)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    arrived = collect(f"{ns}x.work", url=node.url)
    running = Running(Bridge(bridge_user.url, topology))  # up as its own user
    try:
        raw = Raw(producer.url)
        try:
            raw.publish(f"plugin-{ns}", "job.a", {"x-delay": 500})
            raw.publish(f"plugin-{ns}", "job.a", {"x-delay": "soon"})  # parked by the bridge
            assert refused(lambda: raw.publish(f"{ns}.direct", f"{ns}x.work"))  # no shortcut
            assert refused(lambda: raw.channel().basic_get(topology.intakes[0].queue_name(ns)))
        finally:
            raw.close()
        as_bridge = Raw(bridge_user.url)
        try:
            assert refused(lambda: as_bridge.publish(f"plugin-{ns}", "job.a"))
        finally:
            as_bridge.close()
        [arrival] = arrived.wait(1, 30)
        assert arrival.routing_key == "job.a"
        wait_for(lambda: running.bridge.stats.parked == 1, 30, lambda: "the bad one parked")
        _checks_as_users_without_rights_on_the_queues(node, path, topology, producer, bridge_user)
    finally:
        running.stop()
        delete_topology(topology, node.url)


def _checks_as_users_without_rights_on_the_queues(
    node: LocalNode, path: Any, topology: Topology, producer: Any, bridge_user: Any
) -> None:
    """``migrate check`` and ``stats`` over AMQP by users with no right on some queues:
    where the server lets them look (before 4.2.6) they count; where it refuses them even
    a passive declare, the answer says so (exit 1), never missing, 0 or a traceback."""
    hidden = passive_declares_checked(node.version)
    intake = topology.intakes[0].queue_name(topology.namespace)
    check = delayq("migrate", "check", "-f", str(path), "--url", producer.url, "--json")
    assert "Traceback" not in check.stderr
    problems = json.loads(check.stdout)["problems"]
    if hidden:
        assert check.returncode == 1, check.stdout + check.stderr
        assert problems == [
            f"cannot tell whether a bridge consumes {intake}: this user may not look at it "
            f"({problems[0].split('(', 1)[1].rsplit(')', 1)[0]}); check as the bridge's user "
            "or the admin"
        ], problems
    else:
        assert (check.returncode, problems) == (0, []), check.stdout + check.stderr
    as_bridge = delayq("migrate", "check", "-f", str(path), "--url", bridge_user.url, "--json")
    assert (as_bridge.returncode, json.loads(as_bridge.stdout)["problems"]) == (0, [])
    stats = delayq("stats", "-f", str(path), "--url", producer.url, "--no-management", "--json")
    assert "Traceback" not in stats.stderr
    rows = {q["queue"]: q for q in json.loads(stats.stdout)["queues"]}
    assert rows[intake]["exists"] is (None if hidden else True), rows[intake]
    assert rows[intake].get("hidden", False) is hidden
    assert stats.returncode == (1 if hidden else 0), stats.stdout + stats.stderr
    if hidden:
        assert "not counted: this user may not look at" in stats.stderr, stats.stderr
        assert "does not exist" not in stats.stderr
