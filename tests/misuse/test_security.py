"""Misuse of permissions, secrets and publishing under failure: each ends in a clear delayq
error or a correct outcome, on a real broker, and nothing confirmed is lost.

Users are made on the management node with random passwords (see test_grant.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pika
import pytest

from delayq import (
    AccessRefused,
    InvalidInput,
    Message,
    PublishBatchError,
    PublishError,
    Reject,
    Topology,
    TopologyMissing,
)
from delayq.aio import AsyncConsumer, AsyncPublisher
from delayq.cli import main
from delayq.consume.delivery import H_ERROR_MESSAGE, H_ERROR_TRACE
from delayq.local.node import LocalNode
from delayq.sync import Consumer, Publisher, apply_topology
from tests.integration.ops import add_user, delayq, set_permissions, user_permissions
from tests.integration.test_grant import Granted
from tests.waiting import wait_for


def _grant(node: LocalNode, path: Path, *args: str) -> Any:
    env = {**os.environ, **node.env()}
    return delayq(
        "topology", "grant", "--file", str(path), "--url", node.url, "--apply",
        "--rabbitmqctl", shlex.join(node.ctl_command()), *args, env=env,
    )  # fmt: skip


def dlq_headers(url: str, queue: str) -> dict[str, Any]:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        method, props, _ = connection.channel().basic_get(f"{queue}.dlq", auto_ack=True)
        assert method is not None, f"nothing in {queue}.dlq"
        return dict(props.headers or {})
    finally:
        connection.close()


def wait_for_dead_letters(handle: Any, count: int, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while handle.stats.dead_lettered < count and time.monotonic() < deadline:
        time.sleep(0.05)
    assert handle.stats.dead_lettered == count


# --- permissions ------------------------------------------------------------------------------


def test_a_producer_cannot_redeclare_a_tier_with_other_arguments(granted: Granted) -> None:
    """Not even the conflict is reached: the declare is refused, the tier is unchanged."""
    g = granted
    apply_topology(g.topology, g.admin.url)
    tier = f"{g.topology.namespace}.tier.1s"
    connection = pika.BlockingConnection(pika.URLParameters(g.producer.url))
    try:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            connection.channel().queue_declare(
                tier, durable=True, arguments={"x-queue-type": "quorum", "x-message-ttl": 5}
            )
        assert refused.value.reply_code == 403
    finally:
        connection.close()
    assert apply_topology(g.topology, g.admin.url).ok  # still as the topology wants


def test_a_consumer_user_applying_the_topology_is_refused_clearly(granted: Granted) -> None:
    g = granted
    with pytest.raises(AccessRefused, match=f"refused user '{g.consumer.name}'"):
        apply_topology(g.topology, g.consumer.url)
    run = delayq("topology", "apply", "--file", str(g.path), "--url", g.consumer.url)
    assert run.returncode == 1 and "ACCESS_REFUSED" in run.stderr
    assert "delayq topology grant" in run.stderr  # says where the permissions come from
    assert g.consumer.password not in run.stdout + run.stderr


def test_one_user_for_two_roles_is_refused_before_anything_is_set(tmp_path: Path) -> None:
    """RabbitMQ keeps one permission set per user and vhost: the admin's would silently
    replace the consumer's."""
    path = tmp_path / "t.yaml"
    path.write_text("namespace: shared\ndestinations: [{queue: work, bindings: ['#']}]\n")
    argv = ["topology", "grant", "--file", str(path), "--consumer-user", "app"]
    assert main([*argv, "--admin-user", "app", "--apply", "--url", "amqp://u:p@127.0.0.1:1/"]) == 2


@pytest.mark.parametrize("via", ["rabbitmqctl", "management"])
def test_a_grant_on_a_vhost_that_does_not_exist_fails_clearly(
    local_rabbitmq_management_node: LocalNode, node_topology: Any, make_user: Any, via: str
) -> None:
    node = local_rabbitmq_management_node
    _, path = node_topology(node)
    user = make_user("consumer")
    assert node.management_url is not None
    run = _grant(
        node, path, "--consumer-user", user.name, "--vhost", "no-such-vhost", "--via", via,
        "--management-url", node.management_url,
    )  # fmt: skip
    assert run.returncode == 1, run.stdout + run.stderr
    assert "no-such-vhost" in run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize("via", ["rabbitmqctl", "management"])
def test_a_grant_for_an_admin_that_does_not_exist_fails_clearly(
    local_rabbitmq_management_node: LocalNode, node_topology: Any, via: str
) -> None:
    node = local_rabbitmq_management_node
    _, path = node_topology(node)
    assert node.management_url is not None
    run = _grant(
        node, path, "--admin-user", "nobody-admin", "--via", via,
        "--management-url", node.management_url,
    )  # fmt: skip
    assert run.returncode == 1 and "nobody-admin" in run.stderr


def test_a_topology_applied_by_an_earlier_version_stops_a_least_privilege_consumer(
    granted: Granted, driver_kind: str, local_rabbitmq_management_node: LocalNode
) -> None:
    """Partial set-up: <ns>.direct is missing (applied before it existed). The consumer
    may not add it, and says to apply the topology instead of dead-lettering into nothing."""
    g, ns = granted, granted.topology.namespace
    apply_topology(g.topology, g.admin.url)
    connection = pika.BlockingConnection(pika.URLParameters(local_rabbitmq_management_node.url))
    connection.channel().exchange_delete(f"{ns}.direct")
    connection.close()
    with pytest.raises(TopologyMissing, match=rf"{ns}\.direct.*topology apply"):
        if driver_kind == "sync":
            Consumer(g.consumer.url, g.topology, f"{ns}.work", print).start()
        else:
            asyncio.run(AsyncConsumer(g.consumer.url, g.topology, f"{ns}.work", print).start())


# --- secrets in handler errors ----------------------------------------------------------------


def _topology(make_topology: Any) -> tuple[Topology, str]:
    topology = make_topology(["1s"])
    return topology, f"{topology.namespace}.work"


def test_a_one_megabyte_error_with_a_secret_at_the_end_is_dead_lettered_scrubbed(
    rabbitmq_url: str, make_topology: Any, start_consumer: Any
) -> None:
    topology, queue = _topology(make_topology)
    apply_topology(topology, rabbitmq_url)
    secret = f"s{uuid.uuid4().hex}"

    def handler(body: Any) -> None:
        raise Reject("x" * 1_000_000 + f" redis://:{secret}@cache:6379/0")

    handle = start_consumer(topology, queue, handler)
    with Publisher(rabbitmq_url, topology) as pub:
        pub.publish({"n": 1}, "job.a", "0s")
    wait_for_dead_letters(handle, 1)
    headers = dlq_headers(rabbitmq_url, queue)
    assert secret not in repr(headers)
    assert headers[H_ERROR_TRACE].endswith("redis://:***@cache:6379/0\n")
    assert len(headers[H_ERROR_MESSAGE].encode()) <= 1024


def test_a_raising_scrubber_still_dead_letters_scrubbed_by_default_and_is_logged(
    rabbitmq_url: str,
    make_topology: Any,
    start_consumer: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topology, queue = _topology(make_topology)
    apply_topology(topology, rabbitmq_url)
    secret = f"s{uuid.uuid4().hex}"

    def scrubber(text: str) -> str:
        raise RuntimeError(f"scrubber bug on {text}")  # its message holds the text

    def handler(body: Any) -> None:
        raise Reject(f"cannot reach postgresql://app:{secret}@db/x")

    caplog.set_level(logging.WARNING, logger="delayq")
    handle = start_consumer(topology, queue, handler, scrubber=scrubber)
    with Publisher(rabbitmq_url, topology) as pub:
        pub.publish({"n": 1}, "job.a", "0s")
    wait_for_dead_letters(handle, 1)
    headers = dlq_headers(rabbitmq_url, queue)
    assert headers[H_ERROR_MESSAGE] == "cannot reach postgresql://app:***@db/x"
    assert any("scrubber" in r.getMessage() for r in caplog.records)
    assert secret not in caplog.text + repr(headers)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_scrubber_that_is_not_a_function_is_refused_before_connecting(kind: str) -> None:
    topology = Topology(namespace="s", destinations=[{"queue": "w", "bindings": ["#"]}])
    make = Consumer if kind == "sync" else AsyncConsumer
    with pytest.raises(InvalidInput, match="scrubber must be a callable"):
        make("amqp://u:p@127.0.0.1:1/", topology, "w", print, scrubber="***")


def test_a_secret_in_a_retry_reason_is_scrubbed_in_the_retry_headers(
    rabbitmq_url: str, make_topology: Any, start_consumer: Any
) -> None:
    from delayq import Retry

    topology, queue = _topology(make_topology)
    apply_topology(topology, rabbitmq_url)
    secret = f"s{uuid.uuid4().hex}"
    seen: list[int] = []

    def handler(body: Any) -> None:
        seen.append(1)
        if len(seen) == 1:
            raise Retry("0s", f"rate limited, api_key={secret}")
        raise Reject("done")

    handle = start_consumer(topology, queue, handler)
    with Publisher(rabbitmq_url, topology) as pub:
        pub.publish({"n": 1}, "job.a", "0s")
    wait_for_dead_letters(handle, 1)
    headers = dlq_headers(rabbitmq_url, queue)
    assert handle.stats.retried == 1 and secret not in repr(headers)


# --- a broker that goes away under a batch ----------------------------------------------------


def test_a_batch_whose_broker_refuses_the_reconnect_names_exactly_the_unconfirmed(
    local_rabbitmq_management_node: LocalNode,
    node_topology: Any,
    make_user: Any,
    driver_kind: str,
    collect: Any,
) -> None:
    """The connection is closed mid-batch and the password changed: no reconnect can
    succeed. A delayq error names what was not confirmed; every confirmed one arrived."""
    node = local_rabbitmq_management_node
    topology, _ = node_topology(node, ("1s",))
    apply_topology(topology, node.url)
    user = make_user("batch")
    set_permissions(node, user.name, ".*", ".*", ".*")
    queue = f"{topology.namespace}.work"
    batch = [Message(b"z" * 64, "job.a", "0s", message_id=f"b-{n}") for n in range(5_000)]

    def depth() -> int:
        connection = pika.BlockingConnection(pika.URLParameters(node.url))
        try:
            return int(connection.channel().queue_declare(queue, passive=True).method.message_count)
        finally:
            connection.close()

    def cut() -> None:
        deadline = time.monotonic() + 60
        while depth() == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        add_user(node, user.name, "changed-" + user.password)  # the same user, a new password
        node.ctl("close_all_connections", "misuse: broker refuses the reconnect", check=False)

    cutter = threading.Thread(target=cut, daemon=True)
    cutter.start()
    try:
        if driver_kind == "sync":
            with Publisher(user.url, topology, connect_attempts=1) as pub:
                receipts = pub.publish_many(batch)
        else:

            async def run() -> list[Any]:
                async with AsyncPublisher(user.url, topology, connect_attempts=1) as pub:
                    return await pub.publish_many(batch)

            receipts = asyncio.run(run())
        confirmed = {r.message_id for r in receipts}
        unconfirmed: set[str] = set()
    except PublishBatchError as exc:
        confirmed = {r.message_id for r in exc.receipts if r is not None}
        unconfirmed = {batch[i].message_id for i in exc.failures}
        assert all(isinstance(f, PublishError) for f in exc.failures.values())
    cutter.join(60)
    assert confirmed | unconfirmed == {m.message_id for m in batch}
    assert not confirmed & unconfirmed
    inbox = collect(queue, url=node.url)

    def arrived() -> set[str]:
        return {a.message_id for a in inbox.wait(0, timeout_s=0)}

    wait_for(lambda: confirmed <= arrived(), 60, lambda: f"{len(confirmed - arrived())} lost")


@pytest.mark.parametrize("via", ["rabbitmqctl", "management"])
def test_a_grant_never_replaces_a_users_rights_silently(
    local_rabbitmq_management_node: LocalNode, node_topology: Any, make_user: Any, via: str
) -> None:
    """Issue 29: `grant --admin-user guest --apply` replaced guest's `.* .* .*` with rules
    for one namespace, locking guest out of every other, without a word."""
    node = local_rabbitmq_management_node
    assert node.management_url is not None
    _, path = node_topology(node)
    user = make_user("admin")
    set_permissions(node, user.name, ".*", ".*", ".*")

    def held() -> list[tuple[str, str, str, str]]:
        return user_permissions(node, user.name)

    before = held()
    options = ("--admin-user", user.name, "--via", via, "--management-url", node.management_url)
    refused = _grant(node, path, *options)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"user {user.name!r} already has configure '.*', write '.*', read '.*'" in refused.stderr
    assert "--replace" in refused.stderr and "Traceback" not in refused.stderr
    assert held() == before  # nothing set

    replaced = _grant(node, path, *options, "--replace")
    assert replaced.returncode == 0, replaced.stderr
    assert "(replacing configure '.*', write '.*', read '.*')" in replaced.stdout
    assert held() != before
    again = _grant(node, path, *options)  # the same set again: nothing to replace
    assert again.returncode == 0 and "already has these permissions" in again.stdout
