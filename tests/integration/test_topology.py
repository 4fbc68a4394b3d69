"""Provisioning, missing or broken topology, and the paths that park instead of drop."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pika
import pytest

from delayq import (
    ApplyStatus,
    QueueType,
    Topology,
    TopologyConflict,
    TopologyMissing,
    Unroutable,
    build_declarations,
    render_definitions,
)
from delayq.local.node import LocalNode
from delayq.message.envelope import H_DELAY_MS, H_ROUTING_KEY, H_TIER


def test_applying_twice_changes_nothing(driver, make_topology):
    topo = make_topology()
    first = driver.apply(topo)
    assert first.ok and first.count(ApplyStatus.CREATED) > 0
    assert first.count(ApplyStatus.PRESENT) == 0
    second = driver.apply(topo)
    assert second.ok
    assert second.count(ApplyStatus.CREATED) == 0
    assert second.count(ApplyStatus.PRESENT) == first.count(ApplyStatus.CREATED)


def test_a_conflicting_queue_names_entity_argument_and_both_values(
    driver, make_topology, rabbitmq_url
):
    topo = make_topology(["1s"])
    tier_queue = topo.tier_name(topo.ladder.tiers[0])
    [wanted] = [d for d in build_declarations(topo) if d.name == tier_queue and d.kind == "queue"]
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        channel = connection.channel()
        # The same queue as delayq's but for one argument.
        channel.queue_declare(
            tier_queue, durable=True, arguments={**wanted.arguments, "x-overflow": "drop-head"}
        )
        with pytest.raises(TopologyConflict) as caught:
            driver.apply(topo)
        conflict = caught.value
        assert (conflict.kind, conflict.name, conflict.argument) == (
            "queue",
            tier_queue,
            "x-overflow",
        )
        assert (conflict.current, conflict.wanted) == ("drop-head", "reject-publish")
        assert "delete the queue" in str(conflict)
        # The caller's own channel is untouched: delayq used channels of its own.
        assert channel.is_open
        channel.queue_declare(tier_queue, passive=True)
    finally:
        connection.close()
    # Nothing else was declared: the report lists the one conflict, the rest skipped.
    report = driver.apply(topo, raise_on_conflict=False)
    assert [c.name for c in report.conflicts] == [tier_queue]
    assert report.count(ApplyStatus.SKIPPED) == len(build_declarations(topo)) - 1


def test_a_conflict_on_a_connection_the_caller_passes_leaves_it_usable(make_topology, rabbitmq_url):
    from delayq.sync import apply_topology

    topo = make_topology(["1s"])
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        mine = connection.channel()
        mine.exchange_declare(topo.ready_exchange, "fanout", durable=True)
        with pytest.raises(TopologyConflict) as caught:
            apply_topology(topo, connection=connection)
        assert caught.value.argument in ("type", "alternate-exchange")
        assert connection.is_open and mine.is_open
        mine.exchange_declare(topo.ready_exchange, passive=True)
    finally:
        connection.close()


def test_publishing_before_apply_says_to_apply_and_the_publisher_recovers(
    driver, make_topology, collect
):
    topo = make_topology(["1s"])
    with pytest.raises(TopologyMissing, match="topology apply"):
        driver.publish(topo, b"early", "job.a", "1s")
    with pytest.raises(TopologyMissing, match="topology apply"):
        driver.publish(topo, b"early", "job.a", "0s")
    driver.apply(topo)
    inbox = collect(f"{topo.namespace}.work")
    receipt = driver.publish(topo, b"after", "job.a", "0s")  # same publisher, still usable
    [arrival] = inbox.wait(1, timeout_s=5)
    assert arrival.message_id == receipt.message_id


def test_publish_many_before_apply_raises_and_sends_nothing(driver, make_topology):
    from delayq import Message

    topo = make_topology(["1s"])
    with pytest.raises(TopologyMissing, match="topology apply"):
        driver.publish_many(topo, [Message(b"x", "job.a", "1s") for _ in range(5)])


def test_a_tier_exchange_without_its_queue_raises_unroutable(
    driver, make_topology, rabbitmq_url, collect
):
    topo = make_topology(["1s", "2s"])
    driver.apply(topo)
    gone = topo.tier_name(topo.ladder.tiers[0])
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    connection.channel().queue_delete(gone)
    connection.close()
    with pytest.raises(Unroutable) as caught:
        driver.publish(topo, b"lost?", "job.a", "1s", message_id="m-unroutable")
    assert caught.value.message_id == "m-unroutable"
    inbox = collect(f"{topo.namespace}.work")
    receipt = driver.publish(topo, b"fine", "job.a", "2s")  # other tiers still work
    [arrival] = inbox.wait(1, timeout_s=6)
    assert arrival.message_id == receipt.message_id


def test_a_due_message_nobody_binds_is_parked_in_unrouted_with_its_headers(
    driver, make_topology, collect
):
    # A key the topology says is bound elsewhere (external_bindings), which nobody binds.
    topo = make_topology(["1s"], external_bindings=["nobody.*"])
    driver.apply(topo)
    parked = collect(topo.unrouted)
    receipt = driver.publish(topo, {"k": 1}, "nobody.listens", "1s", headers={"tenant": "t1"})
    [arrival] = parked.wait(1, timeout_s=5)
    assert arrival.message_id == receipt.message_id
    assert arrival.routing_key == "nobody.listens"
    assert arrival.headers["tenant"] == "t1"
    assert arrival.headers[H_TIER] == "1s"
    assert arrival.headers[H_DELAY_MS] == 1000
    assert arrival.headers[H_ROUTING_KEY] in ("nobody.listens", b"nobody.listens")
    assert arrival.at_ms - receipt.published_at_ms >= 1000


def test_classic_queue_type_works_for_development(driver, make_topology, collect):
    topo = make_topology(["1s"], queue_type=QueueType.CLASSIC)
    assert driver.apply(topo).ok
    inbox = collect(f"{topo.namespace}.work")
    receipt = driver.publish(topo, b"dev", "job.c", "1s")
    [arrival] = inbox.wait(1, timeout_s=5)
    assert arrival.message_id == receipt.message_id


def _entities(node: LocalNode, namespace: str) -> dict[str, list[str]]:
    """Queues, exchanges and bindings of a namespace as rabbitmqctl lists them."""

    def rows(*args: str) -> list[dict[str, object]]:
        out = node.ctl(*args, "--formatter", "json")
        return json.loads(out[out.index("[") :])  # type: ignore[no-any-return]

    def mine(row: dict[str, object]) -> bool:
        return any(str(v).startswith(namespace) for v in row.values())

    def norm(row: dict[str, object]) -> str:
        if isinstance(row.get("arguments"), list):
            # [name, AMQP type, value]: the type of an int differs between an import
            # ("long") and a declare ("signedint"), which RabbitMQ treats as equal.
            args = sorted((a[0], a[2]) for a in row["arguments"])  # type: ignore[union-attr]
            row = {**row, "arguments": args}
        text = json.dumps(row, sort_keys=True).replace(namespace, "NS")
        # The apply marker's digest covers the names, so it differs per namespace.
        return re.sub(r"NS\.applied\.[0-9a-f]+", "NS.applied.<digest>", text)

    return {
        "queues": sorted(
            norm(r) for r in rows("list_queues", "name", "durable", "arguments") if mine(r)
        ),
        "exchanges": sorted(
            norm(r)
            for r in rows("list_exchanges", "name", "type", "durable", "arguments")
            if mine(r)
        ),
        "bindings": sorted(
            norm(r)
            for r in rows("list_bindings", "source_name", "destination_name", "routing_key")
            if mine(r)
        ),
    }


@pytest.fixture(scope="module")
def fresh_node():
    with LocalNode() as node:
        yield node


def test_exported_definitions_load_into_a_fresh_broker_and_match_apply(
    make_topology, fresh_node, tmp_path, collect
):
    from delayq.sync import Publisher, apply_topology

    imported: Topology = make_topology(["1s", "5s"])
    path = tmp_path / "definitions.json"
    path.write_text(render_definitions(imported))
    fresh_node.ctl("import_definitions", str(path))

    # The same entities, arguments and bindings as `apply` declares.
    applied: Topology = make_topology(["1s", "5s"])
    apply_topology(applied, fresh_node.url)
    want = _entities(fresh_node, applied.namespace)
    got = _entities(fresh_node, imported.namespace)
    assert got["queues"] and got["exchanges"] and got["bindings"]
    assert got == want

    # Applying on top of the import finds everything present and equal.
    report = apply_topology(imported, fresh_node.url)
    assert report.ok and report.count(ApplyStatus.CREATED) == 0

    # And it delivers: the definitions made the apply marker the publisher checks.
    inbox = collect(f"{imported.namespace}.work", url=fresh_node.url)
    with Publisher(fresh_node.url, imported) as pub:
        receipt = pub.publish(b"via definitions", "job.d", "1s")
    [arrival] = inbox.wait(1, timeout_s=5)
    assert arrival.message_id == receipt.message_id


def test_the_committed_definitions_file_is_current():
    from delayq import load_topology

    committed = open("topology/definitions.json").read()
    assert committed == render_definitions(load_topology("topology/delayq.yaml")), (
        "topology/definitions.json is stale: run "
        "`delayq topology export -o topology/definitions.json`"
    )


def test_cli_apply_reports_and_exits_nonzero_on_conflict(make_topology, rabbitmq_url, tmp_path):
    topo = make_topology(["1s"])
    path = tmp_path / "topo.yaml"
    import yaml

    path.write_text(yaml.safe_dump(topo.model_dump(mode="json")))
    run = lambda: subprocess.run(  # noqa: E731
        [
            sys.executable,
            "-m",
            "delayq",
            "topology",
            "apply",
            "--file",
            str(path),
            "--url",
            rabbitmq_url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    first = run()
    assert first.returncode == 0, first.stderr
    assert "created" in first.stdout
    second = run()
    assert second.returncode == 0 and " created" not in second.stdout.split("\n")[-2]
    assert "guest:guest" not in first.stdout + first.stderr
    conflicting = topo.model_dump(mode="json")
    conflicting["destinations"][0]["delivery_limit"] = 3
    path.write_text(yaml.safe_dump(conflicting))
    third = run()
    assert third.returncode == 1
    assert "x-delivery-limit" in third.stdout and "conflict" in third.stdout


def test_a_retry_tier_returns_a_message_to_one_queue_even_past_catch_all_bindings(
    make_topology, rabbitmq_url, collect
):
    """The retry path the consumers use: `<ns>.retry.<tier>` with the queue's name as
    routing key comes back to that queue alone, though another queue binds '#'."""
    from delayq import FixedBackoff
    from delayq.consume.delivery import Delivery
    from delayq.consume.planner import DeliveryPlanner
    from delayq.sync import Publisher, apply_topology

    topo = make_topology(["1s"])
    ns = topo.namespace
    topo = Topology.from_mapping(
        {
            "namespace": ns,
            "ladder": ["1s"],
            "destinations": [
                {"queue": f"{ns}.work", "bindings": ["job.#"]},
                {"queue": f"{ns}.audit", "bindings": ["#"]},
            ],
        }
    )
    apply_topology(topo, rabbitmq_url)
    failed = Delivery(f"{ns}.work", b"{}", "job.a", "m-retry", "application/json", {})
    policy = FixedBackoff(delay="1s", max_attempts=3)
    decision = DeliveryPlanner(topo, f"{ns}.work", policy=policy).failure(failed, ValueError("x"))
    assert decision.message is not None
    work, audit = collect(f"{ns}.work"), collect(f"{ns}.audit")
    with Publisher(rabbitmq_url, topo) as pub:
        pub.send(decision.message)
    [arrival] = work.wait(1, timeout_s=5)
    assert arrival.message_id == "m-retry" and arrival.headers["delayq-attempt"] == 2
    assert arrival.at_ms - decision.message.receipt.published_at_ms >= 1000
    assert audit.settle(1.0) == []
    # Tidy up the extra destination the fixture does not know about.
    from delayq.sync import delete_topology

    delete_topology(topo, rabbitmq_url)
