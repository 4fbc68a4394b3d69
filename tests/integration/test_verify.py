"""``delayq topology verify`` against real nodes: with the management API and without it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pika
import pika.exceptions as pex
import pytest

from delayq import Topology
from delayq.local.node import LocalNode, free_port
from delayq.sync import apply_topology
from tests.integration.ops import delayq, queue_names, rows


def _verify_queues(node: LocalNode, namespace: str) -> set[str]:
    return {q for q in queue_names(node) if q.startswith(f"{namespace}.verify.")}


def _verify(node: LocalNode, path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return delayq("topology", "verify", "--file", str(path), "--url", node.url, *args)


def _applied(node: LocalNode, node_topology: Any) -> tuple[Topology, Path]:
    topology, path = node_topology(node)
    apply_topology(topology, node.url)
    return topology, path


def _admin(node: LocalNode) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(node.url))


def test_an_applied_topology_passes_every_check_through_the_management_api(
    local_rabbitmq_management_node: LocalNode, node_topology
):
    node = local_rabbitmq_management_node
    topology, path = _applied(node, node_topology)
    assert node.management_url is not None
    run = _verify(node, path, "--management-url", node.management_url)
    assert run.returncode == 0, run.stdout + run.stderr
    table = rows(run.stdout)
    assert all(status == "OK" for status, _ in table.values()), run.stdout
    assert table["broker version"][1].startswith(f"RabbitMQ {node.version} ")
    assert "quorum_queue enabled, stream_queue enabled" in table["feature flags"][1]
    assert table["bindings"][1] == "10 bindings present, no stray ones"
    assert table[f"queue {topology.namespace}.tier.30s"][1] == (
        "quorum, durable, 5 arguments as declared"
    )
    assert "arrived through" in table["dead-lettering probe"][1]
    assert f"# {len(table)} checks: {len(table)} OK, 0 FAIL, 0 SKIPPED" in run.stdout
    assert "guest:guest" not in run.stdout + run.stderr
    assert _verify_queues(node, topology.namespace) == set()


def test_an_unapplied_topology_fails_and_the_probe_leaves_nothing_behind(
    local_rabbitmq_management_node: LocalNode, node_topology
):
    node = local_rabbitmq_management_node
    topology, path = node_topology(node)
    assert node.management_url is not None
    run = _verify(node, path, "--management-url", node.management_url)
    assert run.returncode == 1
    table = rows(run.stdout)
    assert table[f"exchange {topology.namespace}.ready"] == (
        "FAIL",
        "missing: run `delayq topology apply`",
    )
    assert table["bindings"][0] == "FAIL" and "10 of 10 missing" in table["bindings"][1]
    assert table["dead-lettering probe"][0] == "FAIL"
    assert (
        f"exchange '{topology.namespace}.ready' does not exist" in table["dead-lettering probe"][1]
    )
    assert {q for q in queue_names(node) if q.startswith(topology.namespace)} == set()


def _break(node: LocalNode, ns: str) -> None:
    """A tier queue with the wrong overflow, a stray binding, a missing binding and queue."""
    connection = _admin(node)
    channel = connection.channel()
    channel.queue_delete(f"{ns}.tier.30s")
    channel.queue_declare(
        f"{ns}.tier.30s",
        durable=True,
        arguments={
            "x-queue-type": "quorum",
            "x-message-ttl": 30000,
            "x-dead-letter-exchange": f"{ns}.ready",
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "drop-head",  # at-least-once silently becomes at-most-once
        },
    )
    channel.queue_bind(f"{ns}.tier.30s", f"{ns}.tier.30s")
    channel.queue_declare(f"{ns}-spy", durable=False, auto_delete=True)
    channel.queue_bind(f"{ns}-spy", f"{ns}.tier.1s")
    channel.queue_unbind(f"{ns}.work", f"{ns}.ready", "job.#")
    channel.queue_delete(f"{ns}.retry.1s")
    connection.close()


def test_what_differs_is_named_through_the_api_and_over_amqp(
    local_rabbitmq_management_node: LocalNode, node_topology
):
    node = local_rabbitmq_management_node
    topology, path = node_topology(node)
    ns = topology.namespace
    apply_topology(topology, node.url)
    _break(node, ns)
    assert node.management_url is not None
    common = ["topology", "verify", "--file", str(path), "--url", node.url, "--no-probe"]

    api = delayq(*common, "--management-url", node.management_url)
    assert api.returncode == 1
    table = rows(api.stdout)
    assert table[f"queue {ns}.tier.30s"][0] == "FAIL"
    assert (
        "x-overflow is 'drop-head', the topology wants 'reject-publish'"
        in table[f"queue {ns}.tier.30s"][1]
    )
    assert table[f"queue {ns}.retry.1s"] == ("FAIL", "missing: run `delayq topology apply`")
    assert table[f"queue {ns}.tier.1s"][0] == "OK"
    bindings = table["bindings"][1]
    assert f"missing: {ns}.ready -> {ns}.work [job.#]" in bindings
    assert f"{ns}.retry.1s -> {ns}.retry.1s [(any)]" in bindings  # its queue is gone
    assert f"unexpected on delayq's own exchanges: {ns}.tier.1s -> {ns}-spy" in bindings
    assert table["dead-lettering probe"] == ("SKIPPED", "--no-probe")

    amqp = delayq(*common, "--no-management")
    assert amqp.returncode == 1
    table = rows(amqp.stdout)
    assert table["management API"][0] == "SKIPPED"
    assert table[f"queue {ns}.tier.30s"][0] == "FAIL"
    assert (
        f"queue '{ns}.tier.30s' exists with x-overflow='drop-head', the topology wants "
        "x-overflow='reject-publish'" in table[f"queue {ns}.tier.30s"][1]
    )
    assert table[f"queue {ns}.retry.1s"] == ("FAIL", "missing: run `delayq topology apply`")
    assert table[f"queue {ns}.tier.1s"][0] == "OK"
    assert table["bindings"][0] == "SKIPPED"
    # Verifying over AMQP re-declares only what exists: it never creates anything.
    connection = _admin(node)
    with pytest.raises(pex.ChannelClosedByBroker) as missing:
        connection.channel().queue_declare(f"{ns}.retry.1s", passive=True)
    assert missing.value.reply_code == 404
    connection.close()


def test_without_the_plugin_verify_goes_over_amqp_and_says_so(
    local_rabbitmq_node: LocalNode, node_topology
):
    node = local_rabbitmq_node
    assert node.management_url is None
    topology, path = _applied(node, node_topology)
    run = _verify(node, path)
    assert run.returncode == 0, run.stdout + run.stderr
    table = rows(run.stdout)
    for skipped in ("management API", "feature flags", "bindings"):
        assert table[skipped][0] == "SKIPPED", table[skipped]
    assert "AMQP checks only" in table["management API"][1]
    assert "AMQP cannot list feature flags" in table["feature flags"][1]
    assert table[f"queue {topology.namespace}.tier.1s"] == (
        "OK",
        "exists; re-declare with its arguments accepted",
    )
    assert table["dead-lettering probe"][0] == "OK"
    assert _verify_queues(node, topology.namespace) == set()


def test_an_explicit_management_url_that_does_not_answer_fails(
    local_rabbitmq_node: LocalNode, node_topology
):
    node = local_rabbitmq_node
    topology, path = _applied(node, node_topology)
    dead = f"http://guest:s3cret@127.0.0.1:{free_port()}/"
    run = _verify(node, path, "--management-url", dead, "--no-probe")
    assert run.returncode == 1
    table = rows(run.stdout)
    assert table["management API"][0] == "FAIL"
    assert "cannot be reached" in table["management API"][1]
    assert table[f"queue {topology.namespace}.work"][0] == "OK"  # the rest ran over AMQP
    assert "s3cret" not in run.stdout + run.stderr


def _failed_probe(run: subprocess.CompletedProcess[str], node: LocalNode, namespace: str) -> str:
    """The probe's detail, once sure it failed the verify and left no queue behind."""
    assert run.returncode == 1
    status, detail = rows(run.stdout)["dead-lettering probe"]
    assert status == "FAIL", detail
    assert _verify_queues(node, namespace) == set()
    return detail


def test_a_probe_that_times_out_fails_and_deletes_its_queues(
    local_rabbitmq_node: LocalNode, node_topology
):
    node = local_rabbitmq_node
    topology, path = _applied(node, node_topology)
    run = _verify(node, path, "--probe-timeout", "1ms")
    assert "within 1ms" in _failed_probe(run, node, topology.namespace)


def test_a_policy_that_drops_dead_letters_fails_the_probe_and_it_cleans_up(
    local_rabbitmq_node: LocalNode, node_topology
):
    node = local_rabbitmq_node
    topology, path = _applied(node, node_topology)
    policy = f"block-{topology.namespace}"
    pattern = f"^{topology.namespace}\\.verify\\."
    node.ctl("set_operator_policy", policy, pattern, '{"max-length": 0}', "--apply-to", "queues")
    try:
        run = _verify(node, path, "--probe-timeout", "3s")
    finally:
        node.ctl("clear_operator_policy", policy)
    assert "did not reach" in _failed_probe(run, node, topology.namespace)
    assert rows(run.stdout)[f"queue {topology.namespace}.tier.1s"][0] == "OK"


def test_the_python_api(local_rabbitmq_management_node: LocalNode, node_topology):
    from delayq.ops.management import ManagementAPI
    from delayq.ops.verify import Status, passed
    from delayq.sync import queue_depths, verify_topology

    node = local_rabbitmq_management_node
    topology, _ = _applied(node, node_topology)
    assert node.management_url is not None
    api = ManagementAPI(node.management_url)
    checks = verify_topology(topology, node.url, management=api, probe_bound_ms=5000)
    assert passed(checks) and all(c.status is Status.OK for c in checks)
    depths, source = queue_depths([f"{topology.namespace}.work", "no.such.queue"], node.url)
    assert source.startswith("AMQP passive declares")
    assert depths["no.such.queue"] is None
    assert depths[f"{topology.namespace}.work"] is not None


def test_verify_json_is_one_document_with_every_check(
    local_rabbitmq_management_node: LocalNode, node_topology
):
    node = local_rabbitmq_management_node
    topology, path = node_topology(node)  # not applied: some checks fail
    run = _verify(node, path, "--json", "--no-probe")
    assert run.returncode == 1, run.stderr
    data = json.loads(run.stdout)  # nothing but the JSON on stdout
    assert data["namespace"] == topology.namespace
    assert data["passed"] is False
    statuses = {c["subject"]: c["status"] for c in data["checks"]}
    assert statuses[f"exchange {topology.namespace}.ready"] == "FAIL"
    assert statuses["broker version"] == "OK"
    assert set(statuses.values()) <= {"OK", "FAIL", "SKIPPED"}
