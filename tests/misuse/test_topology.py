"""Misuse of the topology: partial applies, mismatched files, rights, shared namespaces.

Each scenario ends in a clear delayq error or a correct outcome, and never in a
confirmed message that is lost (issue 12; helper C's slice: topology and publishing).
"""

from __future__ import annotations

import asyncio
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from delayq import (
    AccessRefused,
    ApplyStatus,
    InvalidRoutingKey,
    Message,
    Topology,
    TopologyConflict,
    TopologyMissing,
    TopologyNotApplied,
    render_definitions,
)
from delayq.aio import apply_topology_async as apply_async
from delayq.cli import EXIT_INPUT, main
from delayq.local.node import LocalNode
from delayq.ops.grant import producer_grant
from delayq.ops.management import ManagementAPI
from delayq.ops.verify import Status
from delayq.sync import apply_topology as apply_sync
from delayq.sync import delete_topology, verify_topology
from tests.integration.test_apply_marker import DROP_HEAD, channel, depth, existing

DEAD_URL = "amqp://guest:guest@127.0.0.1:1/"  # refuses connections: nothing is contacted


def variant(topology: Topology, **changes: Any) -> Topology:
    return Topology.model_validate({**topology.model_dump(), **changes})


@pytest.fixture
def node_namespace(local_rabbitmq_management_node: LocalNode) -> Any:
    """Topologies on the management node (users live there); deleted afterwards."""
    made: list[Topology] = []

    def make(**kwargs: Any) -> Topology:
        ns = f"m{uuid.uuid4().hex[:10]}"
        kwargs.setdefault("destinations", [{"queue": f"{ns}.work", "bindings": ["job.#"]}])
        topology = Topology(namespace=ns, ladder=["1s", "5s"], **kwargs)
        made.append(topology)
        return topology

    yield make
    for topology in made:
        delete_topology(topology, local_rabbitmq_management_node.url)


# --- partial and racing applies ----------------------------------------------------------------


def test_two_applies_at_once_both_succeed_and_publishing_works(
    driver, driver_kind, make_topology, rabbitmq_url, collect
):
    topo = make_topology(["1s", "2s"])
    if driver_kind == "sync":
        with ThreadPoolExecutor(2) as pool:
            reports = list(pool.map(lambda _: apply_sync(topo, rabbitmq_url), range(2)))
    else:

        async def both() -> list[Any]:
            url = rabbitmq_url
            return list(await asyncio.gather(apply_async(topo, url), apply_async(topo, url)))

        reports = asyncio.run(both())
    assert all(report.ok for report in reports)
    inbox = collect(f"{topo.namespace}.work")
    receipt = driver.publish(topo, b"after the race", "job.a", "1s")
    [arrival] = inbox.wait(1, timeout_s=10)
    assert arrival.message_id == receipt.message_id


def test_a_destination_queue_that_exists_as_classic_stops_the_apply_before_anything(
    driver, make_topology, rabbitmq_url
):
    topo = make_topology(["1s"])
    work = f"{topo.namespace}.work"
    with channel(rabbitmq_url) as chan:
        chan.queue_declare(work, durable=True, arguments={"x-queue-type": "classic"})
    with pytest.raises(TopologyConflict) as caught:
        driver.apply(topo)
    # RabbitMQ names the first argument it finds different (here the DLX, not the type).
    assert caught.value.name == work and caught.value.argument.startswith("x-")
    assert existing(rabbitmq_url, topo) == {f"queue {work}"}
    with pytest.raises(TopologyNotApplied):  # the first apply never completed
        driver.publish(topo, b"x", "job.a", "1s")
    assert depth(rabbitmq_url, work) == 0


def test_a_later_conflicting_destination_leaves_the_namespace_usable(
    driver, driver_for, make_topology, rabbitmq_url, collect
):
    """A consumer starting with a changed destination must not stop every producer."""
    topo = make_topology(["1s"])
    assert driver.apply(topo).ok
    changed = variant(
        topo, destinations=[{**topo.destinations[0].model_dump(), "delivery_limit": 3}]
    )
    report = driver.apply(changed, raise_on_conflict=False)
    assert [c.argument for c in report.conflicts] == ["x-delivery-limit"]
    assert not report.marker_removed and report.count(ApplyStatus.CREATED) == 0
    inbox = collect(f"{topo.namespace}.work")
    receipt = driver_for(rabbitmq_url).publish(topo, b"still fine", "job.a", "1s")
    [arrival] = inbox.wait(1, timeout_s=10)
    assert arrival.message_id == receipt.message_id


def test_a_tier_deleted_by_hand_is_missing_at_publish_and_apply_restores_it(
    driver, make_topology, rabbitmq_url, collect
):
    topo = make_topology(["1s", "2s"])
    driver.apply(topo)
    gone = topo.tier_name(topo.ladder.tiers[0])
    with channel(rabbitmq_url) as chan:
        chan.queue_delete(gone)
        chan.exchange_delete(gone)
    inbox = collect(f"{topo.namespace}.work")
    with pytest.raises(TopologyMissing, match="topology apply"):
        driver.publish(topo, b"x", "job.a", "1s")
    other = driver.publish(topo, b"y", "job.a", "2s")  # the other tier still works
    report = driver.apply(topo)
    assert report.count(ApplyStatus.CREATED) == 2  # the tier's exchange and queue
    again = driver.publish(topo, b"z", "job.a", "1s")
    arrivals = inbox.wait(2, timeout_s=10)
    assert sorted(a.message_id for a in arrivals) == sorted([other.message_id, again.message_id])


# --- a publisher whose topology is not the applied one -----------------------------------------


def test_a_publisher_with_another_ladder_or_namespace_is_refused(
    driver, driver_for, make_topology, rabbitmq_url
):
    topo = make_topology(["1s", "2s"])
    driver.apply(topo)
    longer = variant(topo, ladder=["1s", "2s", "4s"])  # a tier the broker does not have
    for delay in ("4s", "1s"):  # even into a tier that exists: the layouts differ
        with pytest.raises(TopologyNotApplied, match=topo.namespace):
            driver_for(rabbitmq_url).publish(longer, b"x", "job.a", delay)
    renamed = topo.with_namespace(f"{topo.namespace}x")  # changed between apply and publish
    with pytest.raises(TopologyNotApplied, match=f"{renamed.namespace}.applied"):
        driver_for(rabbitmq_url).publish(renamed, b"x", "job.a", "1s")
    assert set(depth(rabbitmq_url, topo.tier_name(t)) for t in topo.ladder.tiers) == {0}


def test_services_applying_their_own_destinations_into_one_namespace_share_the_marker(
    driver, make_topology, rabbitmq_url, collect
):
    tag = uuid.uuid4().hex[:8]
    billing, shipping = f"billing{tag}", f"shipping{tag}"
    a = make_topology(["1s"], destinations=[{"queue": billing, "bindings": ["order.paid"]}])
    b = variant(a, destinations=[{"queue": shipping, "bindings": ["order.#"]}])
    everyone = [*a.model_dump()["destinations"], *b.model_dump()["destinations"]]
    producer = variant(a, destinations=everyone)
    try:
        assert driver.apply(a).ok and driver.apply(b).ok
        inbox = collect(billing, shipping)
        paid = driver.publish(producer, b"paid", "order.paid", "1s")
        sent = driver.publish(producer, b"sent", "order.sent", "0s")
        arrivals = inbox.wait(3, timeout_s=10)
        assert sorted((x.queue, x.message_id) for x in arrivals) == sorted(
            [(billing, paid.message_id), (shipping, paid.message_id), (shipping, sent.message_id)]
        )
    finally:
        delete_topology(b, rabbitmq_url)


def test_a_wildcard_routing_key_is_refused_before_connecting(driver, make_topology):
    topo = make_topology(["1s"])  # not even applied: the key is refused before any I/O
    for key in ("job.*", "job.#", "#"):
        with pytest.raises(InvalidRoutingKey, match="wildcard"):
            driver.publish(topo, b"x", key, "1s")
        with pytest.raises(InvalidRoutingKey, match=r"message 1: .*wildcard"):
            driver.publish_many(topo, [Message(b"x", "job.a", "1s"), Message(b"y", key, "1s")])


# --- rights --------------------------------------------------------------------------------------


def test_apply_by_a_user_without_configure_rights_declares_nothing(
    local_rabbitmq_management_node: LocalNode, make_user, node_namespace, driver_for
):
    node = local_rabbitmq_management_node
    topo = node_namespace()
    user = make_user("noconfigure")
    node.ctl("set_permissions", "-p", "/", user.name, "^$", ".*", ".*")
    with pytest.raises(AccessRefused, match=f"refused user {user.name!r}"):
        apply_sync(topo, user.url)
    assert existing(node.url, topo) == set()
    with pytest.raises(TopologyNotApplied):  # not a confirm into nothing
        driver_for(user.url).publish(topo, b"x", "job.a", "1s")


def test_a_least_privilege_producer_is_told_to_apply_and_then_publishes(
    local_rabbitmq_management_node: LocalNode, make_user, node_namespace, driver_for, collect
):
    """Checking the marker is a passive declare: no right needed, so the producer's
    grant (configure and read: nothing) still gets the real reason."""
    node = local_rabbitmq_management_node
    topo = node_namespace()
    user = make_user("producer")
    perms = producer_grant(topo, user.name).permissions
    node.ctl("set_permissions", "-p", "/", user.name, perms.configure, perms.write, perms.read)
    producer = driver_for(user.url)
    with pytest.raises(TopologyNotApplied):
        producer.publish(topo, b"x", "job.a", "1s")
    with pytest.raises(TopologyNotApplied):
        producer.publish_many(topo, [Message(b"x", "job.a", "1s")])
    apply_sync(topo, node.url)
    inbox = collect(f"{topo.namespace}.work", url=node.url)
    receipt = producer.publish(topo, b"now applied", "job.a", "1s")  # the same publisher
    [batch] = producer.publish_many(topo, [Message(b"batch", "job.b", "0s")])
    arrivals = inbox.wait(2, timeout_s=10)
    assert {a.message_id for a in arrivals} == {receipt.message_id, batch.message_id}


# --- definitions, which RabbitMQ imports without comparing ---------------------------------------


def test_definitions_loaded_over_a_conflicting_tier_keep_it_and_verify_finds_it(
    local_rabbitmq_management_node: LocalNode, node_namespace, tmp_path: Path
):
    """A limit, stated in the README: import_definitions (and load_definitions) keep an
    existing queue as it is without a word, marker included, so definitions are for a
    fresh broker; ``topology verify`` finds the difference."""
    node = local_rabbitmq_management_node
    topo = node_namespace()
    tier = topo.tier_name(topo.ladder.tiers[-1])
    with channel(node.url) as chan:
        chan.queue_declare(tier, durable=True, arguments=DROP_HEAD)
    path = tmp_path / "definitions.json"
    path.write_text(render_definitions(topo))
    node.ctl("import_definitions", str(path))
    assert node.management_url is not None
    api = ManagementAPI(node.management_url)
    checks = verify_topology(topo, node.url, management=api, probe=False)
    failed = [c.subject for c in checks if c.status is Status.FAIL]
    assert failed == [f"queue {tier}"]


# --- the topology file ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (
            "namespace: shop\ndestinations:\n  - {queue: a, bindings: [a.#]}\n"
            "destinations:\n  - {queue: b, bindings: [b.#]}\n",
            "key 'destinations' appears twice (lines 2 and 4)",
        ),
        ("namespace: shop\nexact: {unit: 5}\n", "exact.unit 5 is a bare number"),
        ("namespace: shop\nexternal_bindings: [audit..x]\n", "binding key 'audit..x'"),
        ("namespace: shop\nexternal_bindings: audit.#\n", "external_bindings"),
    ],
)
def test_a_bad_topology_file_is_refused_before_connecting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, words: str
):
    path = tmp_path / "topology.yaml"
    path.write_text(text)
    for argv in (["topology", "apply"], ["publish", "-k", "a.b", "-d", "1s"]):
        assert main([*argv, "--file", str(path), "--url", DEAD_URL]) == EXIT_INPUT
        err = capsys.readouterr().err
        assert err.startswith("delayq: error: ") and words in err, err



def test_a_topology_naming_another_vhost_than_the_url_is_refused_everywhere(
    make_topology: Any, rabbitmq_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    """Issue 29: `topology apply` of a file with `vhost: /nosuch` and a URL on `/` exited 0
    and declared everything in `/` (verify then failed on the same mismatch). Every way in
    refuses it now, before declaring, sending or consuming anything."""
    from delayq import AsyncPublisher, Consumer, InvalidInput, Publisher

    topo = variant(make_topology(["1s"]), vhost="/nosuch")
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topo.model_dump(mode="json")))
    assert main(["topology", "apply", "--file", str(path), "--url", rabbitmq_url]) == EXIT_INPUT
    err = capsys.readouterr().err
    assert "the topology names vhost '/nosuch', the URL connects to vhost '/'" in err
    assert "path /%2Fnosuch" in err
    assert existing(rabbitmq_url, topo) == set()  # nothing declared in "/"
    with pytest.raises(InvalidInput, match="names vhost '/nosuch'"):
        apply_sync(topo, rabbitmq_url)
    with pytest.raises(InvalidInput, match="names vhost '/nosuch'"):
        asyncio.run(apply_async(topo, rabbitmq_url))
    with pytest.raises(InvalidInput, match="names vhost '/nosuch'"):
        Publisher(rabbitmq_url, topo)
    with pytest.raises(InvalidInput, match="names vhost '/nosuch'"):
        AsyncPublisher(rabbitmq_url, topo)
    queue = topo.destinations[0].queue
    with pytest.raises(InvalidInput, match="names vhost '/nosuch'"):
        Consumer(rabbitmq_url, topo, queue, lambda body: None)
    # A topology that names no vhost takes the URL's; one that names the URL's is fine.
    unnamed = Topology.model_validate({k: v for k, v in topo.model_dump().items() if k != "vhost"})
    assert unnamed.declared_vhost is None and apply_sync(unnamed, rabbitmq_url).ok
    assert apply_sync(variant(topo, vhost="/"), rabbitmq_url).ok
